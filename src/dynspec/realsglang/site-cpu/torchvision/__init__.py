"""dynspec's stand-in for `torchvision`.

Why: SGLang 0.5.9 imports torchvision.transforms at module level (multimodal configs that
every server imports), and the package index's torchvision cannot load beside the CPU torch
build.  A text-only server never calls it: every entry raises naming itself if it does.
"""

from dynspec.realsglang.standin import populate

__version__ = "0.0.0+dynspec.standin"
populate(globals(), {})
