"""`dynspec calibrate` (run): time a random-weight target and drafter in PyTorch into a profile.

The only subpackage that may import torch at module level (random_model); model_shapes names the
model dimensions and imports no torch."""
