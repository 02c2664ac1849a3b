#!/usr/bin/env bash
# One call on the H200 device machine (no network): the real SGLang 0.5.9, upstream and patched by dynspec.
#   1. tiny crafted models, six arms side by side, CUDA graphs on: greedy identity and counters;
#   2. Llama-3.1-8B shapes (dummy weights, bf16): `dynspec sweep --backend live` over
#      experiments/h200-llama8b-price/live.yaml (plain, EAGLE-3, patched never / goodput / threshold:16).
# Needs the wheels in .whl/ (scripts/fetch_h200_wheels.sh, run here first; carried with the call).
# Results land in $OUT: identity.txt/.json, sweep.log, h200-llama8b-live.tgz (the run folder),
# gpu-clocks.csv (the GPU's clocks, temperature and power, once a second), rank-traces.txt (TP servers:
# every rank's step trace compared row by row, dynspec.analysis.rank_traces).
set -u
source scripts/h200_setup.sh
gpu_clock_log
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
CONFIG=${CONFIG:-experiments/h200-llama8b-price/live.yaml}; RUN=${RUN:-$(basename "$CONFIG" .yaml)}
if [ -z "${SKIP_IDENTITY:-}" ]; then
    timeout ${IDENTITY_S:-200} python3 benchmarks/real_sglang_identity.py --gpu --out "$OUT/identity.json" \
        --logs /tmp/identity-logs > "$OUT/identity.txt" 2>&1
    echo "identity exit $?" >> "$OUT/identity.txt"; tail -20 "$OUT/identity.txt"
fi
gpu_idle
make_models "${MODELS:---dummy llama-3.1-8b}"
rm -rf /tmp/traces; mkdir -p /tmp/traces  # DYNSPEC_STEP_TRACE files of configs that ask for them
# A run longer than one call: RESUME_DIR is its folder as the last call brought it back (carried in
# the working tree); the sweep measures what is missing (SWEEP_S bounds each call).
RESUME=""; if [ -n "${RESUME_DIR:-}" ]; then
    rm -rf "/tmp/runs/$RUN"; mkdir -p /tmp/runs; cp -r "$RESUME_DIR" "/tmp/runs/$RUN"; RESUME=--resume
fi
# SWEEP_CPUS (e.g. 0-3): the sweep and its client on those cores only (configs pin their servers)
PIN=""; [ -n "${SWEEP_CPUS:-}" ] && PIN="taskset -c $SWEEP_CPUS"
# The run folder (per-request records left out) to $OUT every 20 s: a call cut by the device's own
# limit still brings back every level it finished, in a folder RESUME_DIR can continue.
( while sleep 20; do
    [ -d "/tmp/runs/$RUN" ] && tar czf "$OUT/.partial.tgz" --exclude=requests -C /tmp/runs "$RUN" 2>/dev/null \
        && mv "$OUT/.partial.tgz" "$OUT/$RUN.partial.tgz"
  done ) & SNAPSHOT=$!
echo "sweep starts $(date -u +%T), ${SECONDS}s into the call" | tee -a "$OUT/gpu.txt"
timeout ${SWEEP_S:-360} $PIN python3 -m dynspec sweep --config "$CONFIG" --run-id "$RUN" $RESUME \
    --runs-dir /tmp/runs > "$OUT/sweep.log" 2>&1
kill $SNAPSHOT 2>/dev/null
echo "sweep exit $?" | tee -a "$OUT/sweep.log"; tail -15 "$OUT/sweep.log"
# step traces (DYNSPEC_STEP_TRACE) of this call beside those of earlier calls of the run
if [ -n "$(ls /tmp/traces 2>/dev/null)" ]; then
    n=1; while [ -e "/tmp/runs/$RUN/traces.call$n" ]; do n=$((n + 1)); done
    cp -r /tmp/traces "/tmp/runs/$RUN/traces.call$n"
    # TP servers write a trace per rank (PATH, PATH.rank1, ...): every rank's decisions, row by row
    if ls /tmp/traces | grep -q '\.rank1$'; then
        python3 -m dynspec.analysis.rank_traces /tmp/traces > "/tmp/runs/$RUN/traces.call$n/rank-traces.txt" 2>&1
        echo "rank traces exit $?" >> "/tmp/runs/$RUN/traces.call$n/rank-traces.txt"
        cp "/tmp/runs/$RUN/traces.call$n/rank-traces.txt" "$OUT/rank-traces.txt"; cat "$OUT/rank-traces.txt"
    fi
fi
tar czf "$OUT/$RUN.tgz" -C /tmp/runs "$RUN"
