#!/usr/bin/env bash
# SGLang 0.5.23 for the H200 machine (Python 3.12, no network), in two folders:
#   .whl-0523-sglang/  sglang 0.5.23, slimmed to 26 MB (scripts/slim_sglang_wheel.py)
#   .whl-0523-deps/    what it needs beyond the image and .whl/ (requirements/h200-wheels-0.5.23.txt), 19 MB
# scripts/h200_probe_0523.sh unpacks them into .device-0523/ (ignored), in one run (STAGE=all) where
# both travel with the working tree and .whl/, or one stage a run where they cannot (its header says how).
set -eu
cd "$(dirname "$0")/.."
rm -rf .whl-0523-sglang .whl-0523-deps; mkdir -p .whl-0523-sglang .whl-0523-deps
pip_download() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "$@"
}
grep -v '^#' requirements/h200-wheels-0.5.23.txt | grep '^sglang==' > /tmp/sglang-0523.req
grep -v '^#' requirements/h200-wheels-0.5.23.txt | grep -v '^sglang==' | grep . > /tmp/deps-0523.req
pip_download -d .whl-0523-sglang -r /tmp/sglang-0523.req
pip_download -d .whl-0523-deps -r /tmp/deps-0523.req
python3 scripts/slim_sglang_wheel.py .whl-0523-sglang/sglang-0.5.23-*.whl
du -sh .whl-0523-sglang .whl-0523-deps
