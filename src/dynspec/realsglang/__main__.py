"""python -m dynspec.realsglang: make tiny models, or start a real SGLang 0.5.9 server.

    python -m dynspec.realsglang models DIR
    python -m dynspec.realsglang serve [--patched] [--gpu] [--site DIR] -- SGLANG_ARGS...

`serve` unpacks (and patches) SGLang into the cache on first use, then replaces itself
with `python -m sglang.launch_server SGLANG_ARGS` in the environment `server_env` builds
(the stand-ins first on PYTHONPATH).  Sweep configs launch real arms this way.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dynspec import realsglang


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dynspec.realsglang", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("models", help="write a tiny target (DIR/target) and EAGLE-3 draft (DIR/draft)")
    m.add_argument("dir")
    m.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    m.add_argument("--dummy", metavar="PRESET", help="configs only, for --load-format dummy, at a preset's "
                   "shapes (e.g. llama-3.1-8b) instead of the tiny crafted models")
    s = sub.add_parser("serve", help="exec the real sglang.launch_server with dynspec's stand-ins")
    s.add_argument("--patched", action="store_true", help="the copy patched by dynspec (else upstream)")
    s.add_argument("--gpu", action="store_true", help="a CUDA machine (else the CPU device)")
    s.add_argument("--site", metavar="DIR", help="an unpacked SGLang to serve instead of the cached copy "
                   "(the tests serve one with a deliberately broken line)")
    s.add_argument("sglang_args", nargs=argparse.REMAINDER, help="arguments for sglang.launch_server (after --)")
    args = ap.parse_args(argv)
    if args.cmd == "models":
        from dynspec.realsglang.tinymodels import make_dummy_models, make_models

        target, draft = (make_dummy_models(args.dir, args.dummy) if args.dummy
                         else make_models(args.dir, dtype=args.dtype))
        print(f"target: {target}\ndraft: {draft}")
        return 0
    rest = args.sglang_args[1:] if args.sglang_args[:1] == ["--"] else args.sglang_args
    if not rest:
        ap.error("serve: give sglang.launch_server's arguments after --")
    if args.site and not (Path(args.site) / "sglang" / "__init__.py").is_file():
        ap.error(f"serve: --site {args.site}: no sglang package there")
    site = Path(args.site).resolve() if args.site else realsglang.sglang_site(args.patched)
    env = realsglang.server_env(site, gpu=args.gpu)
    os.execve(sys.executable, [sys.executable, "-m", "sglang.launch_server", *rest], env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
