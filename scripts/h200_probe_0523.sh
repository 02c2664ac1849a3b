#!/usr/bin/env bash
# What of SGLang 0.5.23 runs on the H200 image (torch 2.11, triton 3.6; 0.5.23 pins torch 2.14.1):
# first its imports, then a plain server of the tiny crafted models on the GPU and one request.
# Three calls, the wheels from scripts/fetch_h200_wheels_0523.sh travelling apart (64 MiB a call):
#   STAGE=sglang  carry [".whl-0523-sglang"]: unpacks sglang 0.5.23 (a wheel is a zip)
#   STAGE=deps    carry [".whl-0523-deps"]:   installs its packages
#   STAGE=probe   carry [".whl"] with reports/ moved aside, as scripts/h200_live.sh: imports, then servers
# into .device-0523/ (ignored: kept between calls on a machine still held).  Writes $OUT/probe-0523.txt.
# Or one call, STAGE=all, carrying all three folders: fits 64 MiB with reports/ and the studies' data
# moved aside and .whl/ holding only what 0.5.23 needs (no sglang 0.5.9, transformers 4.57 or
# tokenizers wheels; .whl-0523-deps without tokenizers, which the image has at 0.23.2).
# Layers take SGLang's torch bodies (SGLANG_FORCE_FUSED_OP_BACKEND=torch, upstream's own switch):
# their CUDA bodies are the native kernel package's.
set -u
OUT=${OUT:-/tmp/h200-out}; mkdir -p "$OUT"
D=$PWD/.device-0523; mkdir -p "$D"
if [ "${STAGE:-}" = all ]; then
    for stage in sglang deps probe; do STAGE=$stage bash "$0" || exit; done
    exit 0
fi
case "${STAGE:?STAGE=sglang, deps, probe or all}" in
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
    rm -f "$OUT/probe-0523.part"
    { python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"
      for m in ${IMPORTS:-sglang.srt.speculative.eagle_worker_v2}; do  # each in a process of its own
          PYTHONPATH=$P SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 timeout 120 python3 -c "import $m" > /tmp/imp.log 2>&1 \
              && echo "import $m: ok" || { echo "import $m: FAILED"; tail -5 /tmp/imp.log; }
      done
      python3 -m dynspec.realsglang models /tmp/tiny-0523 > /tmp/models.log 2>&1 && echo "tiny models: made" || { echo "tiny models: FAILED"; tail -5 /tmp/models.log; }
      # A server's environment is dynspec.realsglang's (server_env: stand-ins, deps, torch layer bodies).
      # --disable-radix-cache: the radix cache's Rust core (built against torch 2.14) misreads torch
      # 2.11's index tensors.
      serve() {  # NAME, then extra server arguments: start, one request, stop
          local name=$1; shift
          DYNSPEC_SGLANG_0523_DEPS=$D/deps timeout 240 python3 -m dynspec.realsglang serve --sglang 0.5.23 --gpu \
              --site "$D/sglang" -- --model-path /tmp/tiny-0523/target --port 31023 \
              --attention-backend triton --sampling-backend pytorch --grammar-backend none --disable-cuda-graph \
              --skip-server-warmup --mem-fraction-static 0.3 --disable-radix-cache "$@" > /tmp/server-0523-$name.log 2>&1 & S=$!
          for _ in $(seq 120); do curl -sf localhost:31023/health > /dev/null && break; kill -0 $S 2>/dev/null || break; sleep 2; done
          curl -s -m 60 localhost:31023/generate -H 'Content-Type: application/json' \
              -d '{"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 8, "temperature": 0}}' \
              && echo && echo "server $name: answered" | tee -a "$OUT/probe-0523.part" || echo "server $name: no answer"
          kill $S 2>/dev/null; sleep 3; echo "--- server $name log (tail)"; tail -40 /tmp/server-0523-$name.log
          nvidia-smi --query-compute-apps=pid --format=csv,noheader | xargs -r kill -9 2>/dev/null; sleep 2
      }
      if [ -z "${SKIP_SERVE:-}" ]; then
          serve plain
          serve eagle3 --speculative-algorithm EAGLE3 --speculative-draft-model-path /tmp/tiny-0523/draft \
              --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
      fi
      # Then, where both answered (or SKIP_SERVE): plain vs upstream steps=0 vs dynspec's off state per
      # output token (experiments/cpu-sglang-0523-steps0/measure.py on the GPU), CUDA graphs on, else off.
      if [ -n "${SKIP_SERVE:-}" ] || [ "$(grep -c ': answered' "$OUT/probe-0523.part" 2>/dev/null)" = 2 ]; then
          for graphs in ${GRAPHS:-on off}; do
              [ "$graphs" = off ] && graphs=--disable-cuda-graph || graphs=""
              DYNSPEC_SGLANG_0523_DEPS=$D/deps DYNSPEC_WHEEL_CACHE=$PWD/.whl-0523-sglang timeout ${MEASURE_S:-240} \
                  python3 experiments/cpu-sglang-0523-steps0/measure.py --gpu --out /tmp/measure-0523 \
                  --models /tmp/tiny-0523 --rounds ${ROUNDS:-8} --out-len 64 \
                  --extra-args "--mem-fraction-static 0.25 --max-total-tokens 16384 --disable-radix-cache $graphs" > /tmp/measure.log 2>&1 \
                  && { cp /tmp/measure-0523/results.json "$OUT/steps0-gpu${graphs:+-no-graphs}.json"; echo "measured (${graphs:-graphs on})"; break; } \
                  || { echo "measure (${graphs:-graphs on}) FAILED"; tail -30 /tmp/measure.log; tail -30 /tmp/measure-0523/logs/*.log; rm -rf /tmp/measure-0523; }
          done
      fi
    } 2>&1 | tee "$OUT/probe-0523.txt";;
*) echo "STAGE must be sglang, deps, probe or all"; exit 2;;
esac
