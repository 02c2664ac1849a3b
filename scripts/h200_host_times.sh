#!/usr/bin/env bash
# One call on the H200 device machine (no network): host milliseconds per decode step in SGLang's scheduler
# and worker functions, and each forward's GPU time, each as a total and by duration (a few long
# calls or many slightly longer ones), plain server against the patched server with
# DYNSPEC_POLICY=never, under one closed-loop load (dynspec.realsglang.hosttime).
# Needs the wheels in .whl/ (scripts/fetch_h200_wheels.sh, run here first; carried with the call).
#   C=64 REQUESTS=640 bash scripts/h200_host_times.sh      -> $OUT/host-times-c64.txt, .json
set -u
source scripts/h200_setup.sh
C=${C:-64}
gpu_idle; timeout ${HOST_TIMES_S:-500} python3 experiments/h200-real-sglang/sync_census.py --gpu --dummy llama-3.1-8b \
    --requests ${REQUESTS:-640} --tokens ${TOKENS:-128} --prompt-len ${PROMPT_LEN:-256} --concurrency "$C" \
    --host-times --device-timer --out "$OUT/host-times-c$C.json" > "$OUT/host-times-c$C.txt" 2>&1
echo "host times exit $?" >> "$OUT/host-times-c$C.txt"; grep -v '^\s*$' "$OUT/host-times-c$C.txt" | tail -60
