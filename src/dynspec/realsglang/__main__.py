"""python -m dynspec.realsglang: make tiny models, or start a real SGLang 0.5.9 server.

    python -m dynspec.realsglang models DIR
    python -m dynspec.realsglang models DIR --crafted llama-3.1-8b --draft-accuracy 0.6 [--device cuda]
    python -m dynspec.realsglang serve [--sglang 0.5.9|0.5.23] [--patched] [--gpu] [--site DIR] -- SGLANG_ARGS...

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
    m.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="weights' dtype (default: float32 tiny, bfloat16 crafted)")
    m.add_argument("--dummy", metavar="PRESET", help="configs only, for --load-format dummy, at a preset's "
                   "shapes (e.g. llama-3.1-8b) instead of the tiny crafted models")
    m.add_argument("--crafted", metavar="PRESET", help="a preset's shapes (e.g. llama-3.1-8b) with weights built "
                   "so that the draft is right at --draft-accuracy (dynspec.realsglang.crafted)")
    m.add_argument("--draft-accuracy", default="0.6", metavar="P[,P...]",
                   help="share of draft positions that are right, one per prompt class (default 0.6)")
    m.add_argument("--active", type=int, default=4096, help="tokens the crafted models use (default 4096)")
    m.add_argument("--device", default="cpu", help="where the crafted weights are drawn (cuda: seconds)")
    s = sub.add_parser("serve", help="exec the real sglang.launch_server with dynspec's stand-ins")
    s.add_argument("--sglang", default=realsglang.VERSION, choices=realsglang.VERSIONS, metavar="VERSION",
                   help="the SGLang release to serve: 0.5.9 (default) or 0.5.23")
    s.add_argument("--patched", action="store_true", help="the copy patched by dynspec (else upstream)")
    s.add_argument("--gpu", action="store_true", help="a CUDA machine (else the CPU device)")
    s.add_argument("--site", metavar="DIR", help="an unpacked SGLang to serve instead of the cached copy "
                   "(the tests serve one with a deliberately broken line)")
    s.add_argument("sglang_args", nargs=argparse.REMAINDER, help="arguments for sglang.launch_server (after --)")
    args = ap.parse_args(argv)
    if args.cmd == "models":
        from dynspec.realsglang import crafted
        from dynspec.realsglang.tinymodels import make_dummy_models, make_models

        if args.dummy and args.crafted:
            ap.error("models: --dummy or --crafted, not both")
        if args.crafted:
            try:
                c = crafted.crafted(args.crafted, args.draft_accuracy, active=args.active)
            except crafted.CraftError as exc:
                ap.error(f"models: {exc}")
            target, draft = crafted.write(args.dir, c, device=args.device, dtype=args.dtype or "bfloat16")
            for k in c.classes():
                print(f"class ids {k['lo']}..{k['hi'] - 1}: draft right {k['accuracy']:.2f} of positions, "
                      f"accept length {k['accept_length']:.3f} at {c.steps} steps")
        elif args.dummy:
            target, draft = make_dummy_models(args.dir, args.dummy)
        else:
            target, draft = make_models(args.dir, dtype=args.dtype or "float32")
        print(f"target: {target}\ndraft: {draft}")
        return 0
    rest = args.sglang_args[1:] if args.sglang_args[:1] == ["--"] else args.sglang_args
    if not rest:
        ap.error("serve: give sglang.launch_server's arguments after --")
    if args.site and not (Path(args.site) / "sglang" / "__init__.py").is_file():
        ap.error(f"serve: --site {args.site}: no sglang package there")
    site = Path(args.site).resolve() if args.site else realsglang.sglang_site(args.patched, version=args.sglang)
    env = realsglang.server_env(site, gpu=args.gpu, version=args.sglang)
    os.execve(sys.executable, [sys.executable, "-m", "sglang.launch_server", *rest], env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
