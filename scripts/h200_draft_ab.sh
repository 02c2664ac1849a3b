#!/usr/bin/env bash
# One call on the H200 device machine: upstream EAGLE-3 servers on the crafted 8B models, one per variant of
# the draft path (spec v1/v2, CUDA graphs on/off, the draft's attention on torch_native), accept
# length per request at concurrency 1, 4, 8 (experiments/h200-llama8b-crafted/draft_ab.py).
# MODELS as in h200_live.sh; VARIANTS=a,b picks some.  Results: $OUT/draft_ab.json, draft_ab.txt.
set -u
source scripts/h200_setup.sh
make_models "${MODELS:---crafted llama-3.1-8b --draft-accuracy 0.6 --active 4096}"
timeout ${AB_S:-500} python3 experiments/h200-llama8b-crafted/draft_ab.py models-8b "$OUT/draft_ab.json" \
    ${VARIANTS:+--variants $VARIANTS} 2>&1 | tee "$OUT/draft_ab.txt"
for f in "$OUT"/draft_ab_logs/*.log; do tail -c 20000 "$f" > "$f.tail" && rm "$f"; done
