#!/usr/bin/env bash
# One call on the H200 device machine: does a real SGLang 0.5.9 keep a closed loop in lockstep?  The patched
# EAGLE-3 server with DYNSPEC_POLICY=goodput at C = 16 and 64, fixed lengths (256 in, 128 out),
# then output lengths in 64..128 (configs/h200-llama8b-lockstep{,-range}.yaml).  What goodput read
# from the prefill forwards is in each run's scrapes/ (/get_server_info after every level):
#   python experiments/h200-llama8b-lockstep/lockstep_read.py experiments/h200-llama8b-lockstep/data/h200-llama8b-lockstep*
# Needs the wheels in .whl/ (scripts/fetch_h200_wheels.sh, run here first; carried with the call).
set -u
source scripts/h200_setup.sh
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
python3 -m dynspec.realsglang models models-8b --dummy llama-3.1-8b
for RUN in h200-llama8b-lockstep h200-llama8b-lockstep-range; do
    gpu_idle
    timeout ${SWEEP_S:-270} python3 -m dynspec sweep --config "configs/$RUN.yaml" --run-id "$RUN" \
        --runs-dir /tmp/runs > "$OUT/sweep-$RUN.log" 2>&1
    echo "sweep exit $?" | tee -a "$OUT/sweep-$RUN.log"; tail -8 "$OUT/sweep-$RUN.log"
    tar czf "$OUT/$RUN.tgz" -C /tmp/runs "$RUN"
done
