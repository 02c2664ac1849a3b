#!/usr/bin/env bash
# What of SGLang 0.5.23 runs on the H200 image (torch 2.11, triton 3.6; 0.5.23 pins torch 2.14.1):
# first its imports, then a plain server of the tiny crafted models on the GPU and one request.
# Three calls, the wheels from scripts/fetch_h200_wheels_0523.sh travelling apart (64 MiB a call):
#   STAGE=sglang  carry [".whl-0523-sglang"]: unpacks sglang 0.5.23 (a wheel is a zip)
#   STAGE=deps    carry [".whl-0523-deps"]:   installs its packages
#   STAGE=probe   carry [".whl"] with reports/ moved aside, as scripts/h200_live.sh: imports, then one server
# into .device-0523/ (ignored: kept between calls on a machine still held).  Writes $OUT/probe-0523.txt.
set -u
OUT=${OUT:-/tmp/h200-out}; mkdir -p "$OUT"
D=$PWD/.device-0523; mkdir -p "$D"
case "${STAGE:?STAGE=sglang, deps or probe}" in
sglang) python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" \
            .whl-0523-sglang/sglang-0.5.23-*.whl "$D/sglang" && echo "sglang 0.5.23 unpacked" | tee "$OUT/probe-0523.txt";;
deps) python3 -m pip install -q --no-index --no-deps --no-compile --target "$D/deps" .whl-0523-deps/*.whl \
            && echo "0.5.23 packages installed" | tee "$OUT/probe-0523.txt";;
probe)
    source scripts/h200_setup.sh
    [ -d "$D/sglang/sglang" ] && [ -d "$D/deps" ] || { echo "run STAGE=sglang and STAGE=deps first (on a held machine)"; exit 2; }
    # 0.5.23's packages before 0.5.9's (/tmp/site: transformers 4.57); dynspec's CPU-side stand-ins for
    # the native kernel package, which is CUDA-only and 373 MB.
    P=$PWD/src/dynspec/realsglang/site-0.5.23:$D/deps:$D/sglang:$PYTHONPATH
    { python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"
      for m in sglang.srt.server_args sglang.srt.model_executor.model_runner sglang.srt.speculative.eagle_worker_v2 \
               sglang.srt.managers.scheduler sglang.srt.entrypoints.http_server; do
          PYTHONPATH=$P SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 timeout 120 python3 -c "import $m" > /tmp/imp.log 2>&1 \
              && echo "import $m: ok" || { echo "import $m: FAILED"; tail -5 /tmp/imp.log; }
      done
      python3 -m dynspec.realsglang models /tmp/tiny-0523 > /dev/null 2>&1
      PYTHONPATH=$P SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 SGLANG_EXTERNAL_MODEL_PACKAGE=dynspec_models \
          timeout 240 python3 -m sglang.launch_server --model-path /tmp/tiny-0523/target --port 31023 \
          --attention-backend triton --sampling-backend pytorch --grammar-backend none --disable-cuda-graph \
          --skip-server-warmup --mem-fraction-static 0.3 > /tmp/server-0523.log 2>&1 & S=$!
      for _ in $(seq 120); do curl -sf localhost:31023/health > /dev/null && break; sleep 2; done
      curl -s -m 60 localhost:31023/generate -H 'Content-Type: application/json' \
          -d '{"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 8, "temperature": 0}}' \
          && echo && echo "server: answered" || echo "server: no answer"
      kill $S 2>/dev/null; sleep 3; echo "--- server log (tail)"; tail -40 /tmp/server-0523.log
    } 2>&1 | tee "$OUT/probe-0523.txt";;
*) echo "STAGE must be sglang, deps or probe"; exit 2;;
esac
