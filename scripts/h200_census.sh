#!/usr/bin/env bash
# One call on the H200 device machine (no network): where a patched plain step's time goes.
#   1. experiments/h200-real-sglang/sync_census.py --gpu --dummy llama-3.1-8b: the calls that wait for the GPU per
#      decode step, plain server against the patched server with DYNSPEC_POLICY=never;
#   2. a torch profiler trace of 30 decode steps per arm (SGLang's /start_profile), for
#      Perfetto: the CPU gaps between the target's graph replays, and what the GPU runs there.
# Needs the wheels in .whl/ (scripts/fetch_h200_wheels.sh, run here first; carried with the call).
#   3. experiments/h200-real-sglang/trace_gaps.py on both traces: GPU idle per step by the CPU site that ended it,
#      host waits by site, the kernels that take the GPU's time.
# Results land in $OUT: gpu.txt, census.txt, census.json, gaps.txt, gaps.json, trace-<arm>.json.gz
set -u
source scripts/h200_setup.sh
STEPS=${PROFILE_STEPS:-30}; WORK=/tmp/census; mkdir -p "$WORK"
# PROMPT_LEN=1024 PROFILE_STEPS=12 TOKENS=4: a trace that holds the prompts' prefills, for the
# draft prefill's share (gpu_by_span) rather than the decode steps'.
# CENSUS_ARGS: more options, e.g. a running load at C=64 (a wave of prefills inside the trace):
#   REQUESTS=384 TOKENS=128 PROMPT_LEN=256 PROFILE_STEPS=160 \
#   CENSUS_ARGS="--concurrency 64 --profile-after 3 --no-census" bash scripts/h200_census.sh
gpu_idle; timeout ${CENSUS_S:-400} python3 experiments/h200-real-sglang/sync_census.py --gpu --dummy llama-3.1-8b --requests ${REQUESTS:-4} \
    --tokens ${TOKENS:-64} --prompt-len ${PROMPT_LEN:-0} --profile-steps "$STEPS" --out "$WORK/census.json" \
    ${CENSUS_ARGS:-} > "$OUT/census.txt" 2>&1
echo "census exit $?" >> "$OUT/census.txt"; tail -30 "$OUT/census.txt"
cp "$WORK/census.json" "$OUT/" 2>/dev/null
python3 experiments/h200-real-sglang/trace_gaps.py --steps "$STEPS" --out "$OUT/gaps.json" \
    --spans _draft_extend_for_prefill,_dynspec_kv_only_prefill,_dynspec_flush_draft_kv,_dynspec_plain_step,_dynspec_resume,prepare_for_decode \
    plain="$WORK/traces/plain" patched-never="$WORK/traces/patched-never" > "$OUT/gaps.txt" 2>&1
cat "$OUT/gaps.txt"
for arm in plain patched-never; do  # the largest trace per arm, when it fits what comes back (16 MiB)
    f=$(ls -S "$WORK/traces/$arm"/*.trace.json* 2>/dev/null | head -1)
    [ -n "$f" ] && [ "$(stat -c %s "$f")" -lt 16000000 ] && cp "$f" "$OUT/trace-$arm.json.gz"
done
