# Sourced by the scripts/h200_*.sh device scripts: the H200 device machine has no network and no SGLang,
# so the carried wheels in .whl/ (scripts/fetch_h200_wheels.sh) are installed into /tmp/site,
# SGLang itself is unpacked from its wheel by dynspec.realsglang, and the GPU is recorded.
OUT=${OUT:-/tmp/h200-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 DYNSPEC_SGLANG_CACHE=/tmp/sglang-cache DYNSPEC_WHEEL_CACHE=$PWD/.whl
[ -f /tmp/site/.installed ] || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v /sglang-) && touch /tmp/site/.installed; } || exit 1
export PYTHONPATH=$PWD/src:/tmp/site
# TP servers on several GPUs of one host: NCCL's NVLink multicast (NVLS) stays off, as the
# multi-GPU machines this runs on require; TP=2 all-reduces over NVLink rings.
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
# Between phases of one call: a killed server frees its GPU memory only once its processes are
# gone; the next phase's servers size their KV pools from what is free then.
gpu_idle() { for _ in $(seq 60); do [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ] && return; sleep 2; done; }
# The GPU's clocks, temperature, power and throttle reasons once a second, for the whole call: two
# servers measured one after the other are comparable only if the GPU ran alike for both (read
# only; the machine's settings are left as they are).
gpu_clock_log() {
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu,clocks_throttle_reasons.active \
        --format=csv -l 1 > "$OUT/gpu-clocks.csv" 2>/dev/null &
    GPU_CLOCK_LOG_PID=$!
    # The host's CPU time once a second (/proc/stat: user, system, idle, iowait, steal per CPU, in
    # clock ticks): a server's eager work (prefill) runs as fast as its core, which the machine's
    # hypervisor may share ("steal").
    ( while true; do echo "$(date +%s.%N) $(grep '^cpu' /proc/stat | tr '\n' ' ')"; sleep 1; done ) \
        > "$OUT/cpu-stat.log" 2>/dev/null &
    CPU_STAT_LOG_PID=$!
    trap 'kill $GPU_CLOCK_LOG_PID $CPU_STAT_LOG_PID 2>/dev/null' EXIT
}
# The 8B-shaped models in models-8b/: dummy weights ("--dummy llama-3.1-8b") or crafted ones
# ("--crafted llama-3.1-8b --draft-accuracy 0.6", drawn on the GPU).  Kept on a machine held
# between calls unless the arguments change.
make_models() {
    if [ "$(cat models-8b/.made-by 2>/dev/null)" != "$1" ]; then
        rm -rf models-8b
        case "$1" in *--crafted*) DEVICE="--device cuda";; *) DEVICE="";; esac
        python3 -m dynspec.realsglang models models-8b $1 $DEVICE > "$OUT/models.txt" 2>&1 \
            && echo "$1" > models-8b/.made-by
        case "$1" in *--crafted*)  # the draft head's guesses along the cycle, in a torch reference
            python3 -c "from dynspec.realsglang.crafted import draft_accuracy as a; print('draft right on', a('models-8b', 1000, 400), 'of positions from id 1000')" >> "$OUT/models.txt" 2>&1;;
        esac
        cat "$OUT/models.txt"
    fi
}
