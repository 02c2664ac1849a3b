#!/usr/bin/env bash
# One call on the lent H200 (no network): where a patched plain step's time goes (issue #13).
#   1. benchmarks/sync_census.py --gpu --dummy llama-3.1-8b: the calls that wait for the GPU per
#      decode step, plain server against the patched server with DYNSPEC_POLICY=never;
#   2. a torch profiler trace of 30 decode steps per arm (SGLang's /start_profile), for
#      Perfetto: the CPU gaps between the target's graph replays, and what the GPU runs there.
# Needs the wheels in .whl/ (scripts/fetch_h200_wheels.sh, run here first; carried with the call).
# Results land in $OUT: gpu.txt, census.txt, census/census.json, census/traces/<arm>/*.trace.json.gz
set -u
source scripts/h200_setup.sh
mkdir -p "$OUT/census"
timeout ${CENSUS_S:-400} python3 benchmarks/sync_census.py --gpu --dummy llama-3.1-8b --requests 4 --tokens 64 \
    --profile-steps ${PROFILE_STEPS:-30} --out "$OUT/census/census.json" > "$OUT/census.txt" 2>&1
echo "census exit $?" >> "$OUT/census.txt"; tail -30 "$OUT/census.txt"
