#!/usr/bin/env bash
# The Python packages SGLang 0.5.9 needs on the H200 device machine beyond its own torch/triton image, as
# wheels in .whl/ (ignored by git; carried to the GPU machine with each run).  Python 3.12, x86_64.
set -eu
cd "$(dirname "$0")/.."
mkdir -p .whl
rm -f .whl/*.whl  # exactly the listed wheels: a stale one would travel (64 MiB a call) or clash
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
  --platform manylinux1_x86_64 -d .whl -r requirements/h200-wheels.txt
