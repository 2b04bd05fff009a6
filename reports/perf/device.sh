#!/usr/bin/env bash
# One device run of every benchmark: `rlany bench --kernels` and `--models` on CUDA and WGPU
# and the PyTorch anchor, side by side on the same GPU, then `rlany report --bench` over all
# of it; with TRAIN=1, first the closed loop itself on the GPU (SmolLM2 + LoRA). Everything lands
# in $OUT/all.tar.gz, $OUT/device.log beside it (the device's tool returns at most 8 files).
#
# Prepared here (the device has no cargo), in the checkout's root:
#   CUDARC_CUDA_VERSION=13000 cargo build --release -p rlany --features cuda
#   mkdir -p bench-anchor && cp target/release/rlany bench-anchor/rlany-cuda
#   cargo build --release -p rlany --features wgpu && cp target/release/rlany bench-anchor/rlany-wgpu
#   cp <the PyTorch anchor script> bench-anchor/torch_anchor.py
#   (a binary too large for a call may travel as `bench-anchor/rlany-cuda.xz`: unpacked there)
#   (and the Vulkan loader packages in .gl/ for WGPU: see the device tool's README)
# Run there with `carry: ["bench-anchor", ".gl"]`:
#   bash reports/perf/device.sh
#
# Every step has its own time cap, no step starts past the deadline (the device's command
# limit is 10 minutes), and a failed step does not stop the others. The anchor runs first, so
# the reference exists whatever happens later. Knobs:
#   BACKENDS  (default "cuda wgpu"; "ndarray" tests this script on a CPU)
#   QUICK=1   the --quick model sizes (CPU)
#   CAP       seconds per step (default 90); DEADLINE seconds for everything (default 540)
#   ANCHOR=0  skips PyTorch; ANCHOR_CAP seconds for it (default 180)
#   PROFILE=0 skips the profiles: on each Cube backend (cuda, wgpu), after the table, T_small
#             with every launch timed after its warm-up (`bench --profile`: where the PPO
#             step's device time goes, by kernel) and R_small's launches per decoded token,
#             in $OUT/profile/ (kept out of the report: profiled times are not the table's)
#   TRAIN=1   first, the loop itself on the first backend of BACKENDS: TRAIN_FILE (default
#             experiments/pretrained/smollm2_arith.ron, SmolLM2 + LoRA, policy and judge)
#             for 2 steps at a tiny size (does a training step complete?), then at its own
#             size for TRAIN_CAP seconds (default 150; does it learn?); both runs' output
#             in $OUT/train.log, the learning run's metrics in $OUT/train-metrics.jsonl.
#             The GGUF (98 MB: more than one call's 64 MiB) is put back from
#             `$DIR/model.part*` when the file the experiment names is missing: `split -n 2`
#             it here, carry one part per call (carry names the file path, e.g.
#             `bench-anchor/model.partaa`, so the next call keeps the first) in two calls made
#             back to back on the warm machine, the second running this script.
#             TRAIN_SET: extra `--set` arguments for both runs (e.g. the dtype); TRAIN_TINY:
#             the tiny run's (default: 4 tasks × 4 rollouts, 16 eval tasks, 2 judge steps).
set -u
# Started directly, not by `cargo run`: the allocator setting of .cargo/config.toml by hand.
export MIMALLOC_PURGE_DELAY=${MIMALLOC_PURGE_DELAY:--1}
START=$(date +%s)
OUT=${OUT:-/tmp/rlany-device}
DIR=${DIR:-bench-anchor}
BACKENDS=${BACKENDS:-cuda wgpu}
CAP=${CAP:-90}
DEADLINE=${DEADLINE:-540}
ANCHOR=${ANCHOR:-1}
ANCHOR_CAP=${ANCHOR_CAP:-180}
QUICK=${QUICK:-}
mkdir -p "$OUT" "$OUT/parts"
LOG="$OUT/device.log"
say() { echo "[$(date -u +%T)] $*" | tee -a "$LOG"; }
# The cap of the next step: CAP, or what is left before the deadline minus 30 s for the
# report; 0 when nothing is left.
cap() {
    local left=$((DEADLINE - ($(date +%s) - START) - 30))
    if [ "$left" -lt 10 ]; then echo 0; elif [ "$left" -lt "$CAP" ]; then echo "$left"; else echo "$CAP"; fi
}

say "host: $(uname -m), $(nproc) cores"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$LOG" 2>&1
if [ -d .gl ] && ls .gl/*.deb >/dev/null 2>&1; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
fi

# A binary carried xz-compressed (a stripped CUDA build is large for one call's 64 MiB) is
# unpacked beside itself first.
for z in "$DIR"/rlany*.xz; do
    [ -f "$z" ] && [ ! -x "${z%.xz}" ] || continue
    python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" \
        "$z" "${z%.xz}" && chmod +x "${z%.xz}" && say "unpacked ${z%.xz}"
done

binary() { # the rlany binary of a backend
    if [ -x "$DIR/rlany-$1" ]; then echo "$DIR/rlany-$1"; else echo "$DIR/rlany"; fi
}

# The loop on the device: a tiny 2-step run, then a capped learning run (TRAIN=1).
if [ -n "${TRAIN:-}" ]; then
    TRAIN_FILE=${TRAIN_FILE:-experiments/pretrained/smollm2_arith.ron}
    TRAIN_CAP=${TRAIN_CAP:-150}
    TRAIN_TINY=${TRAIN_TINY:---set budget.tasks_per_step=4 --set budget.group_size=4 --set budget.eval_tasks=16 --set judge.warm_start.steps=2}
    be=${BACKENDS%% *}
    bin=$(binary "$be")
    model=$(sed -n 's/.*path: "\(models\/pretrained\/[^"]*\.gguf\)".*/\1/p' "$TRAIN_FILE" | head -1)
    if [ -n "$model" ] && [ ! -f "$model" ] && ls "$DIR"/model.part* >/dev/null 2>&1; then
        mkdir -p "$(dirname "$model")"
        cat "$DIR"/model.part* >"$model"
        say "train: $model put back from its parts, sha256 $(sha256sum "$model" | cut -c1-16)…"
    fi
    # shellcheck disable=SC2086 # TRAIN_SET is a list of arguments
    t=$(cap); say "train: $TRAIN_FILE on $be, 2 tiny steps (cap ${t}s)"
    echo "== tiny: 2 steps" >"$OUT/train.log"
    timeout "$t" "$bin" run "$TRAIN_FILE" --backend "$be" --no-progress --runs-dir "$OUT/train-tiny" \
        --stop-after 2 $TRAIN_TINY ${TRAIN_SET:-} \
        >>"$OUT/train.log" 2>&1 && say "train: tiny steps done" || say "train: tiny exited $?"
    m=$(find "$OUT/train-tiny" -name metrics.jsonl 2>/dev/null | head -1)
    say "train: tiny run wrote $(cat "$m" 2>/dev/null | wc -l) metrics lines"
    rm -rf "$OUT/train-tiny"
    t=$(cap); [ "$t" -gt "$TRAIN_CAP" ] && t=$TRAIN_CAP
    say "train: learning run (cap ${t}s)"
    echo "== learning run, cap ${t}s" >>"$OUT/train.log"
    # shellcheck disable=SC2086
    timeout "$t" "$bin" run "$TRAIN_FILE" --backend "$be" --no-progress --runs-dir "$OUT/train" \
        --set budget.checkpoint_every=1000 ${TRAIN_SET:-} >>"$OUT/train.log" 2>&1
    rc=$?
    # A capped run ends by timeout (124): what it wrote is the measurement.
    [ $rc = 0 ] || [ $rc = 124 ] || say "train: learning run exited $rc"
    m=$(find "$OUT/train" -name metrics.jsonl 2>/dev/null | head -1)
    [ -n "$m" ] && cp "$m" "$OUT/train-metrics.jsonl"
    rm -rf "$OUT/train"
    say "train: $(cat "$OUT/train-metrics.jsonl" 2>/dev/null | wc -l) metrics lines in the learning run"
fi

# Model workloads one at a time, so each gets its own cap; rollouts use the anchor's 3
# repeats (after one warm-up), the PPO steps 5, as torch_anchor.py does.
if [ -n "$QUICK" ]; then
    MODELS="R_small@quick:3 T_small@quick:5 C_tiny_R@quick:3 C_tiny_T:5"
    QFLAG=--quick
else
    MODELS="R_small:3 T_small:5 R_qwen05b:3 T_qwen05b:5 C_tiny_T:5"
    QFLAG=
fi

if [ "$ANCHOR" = 1 ] && [ -f "$DIR/torch_anchor.py" ]; then
    say "PyTorch anchor"
    OUT="$OUT" PYTHONUNBUFFERED=1 timeout "$ANCHOR_CAP" python3 "$DIR/torch_anchor.py" >>"$LOG" 2>&1 \
        || say "anchor exited $?"
fi

for be in $BACKENDS; do
    bin=$(binary "$be")
    [ -x "$bin" ] || { say "$be: no binary at $bin, skipped"; continue; }
    t=$(cap); [ "$t" -gt 0 ] || { say "$be: deadline reached, kernels skipped"; continue; }
    say "$be: kernels (cap ${t}s)"
    timeout "$t" "$bin" bench --kernels --backend "$be" --json "$OUT/parts/$be-kernels.json" \
        ${QUICK:+--n 512 --vocab 4096} >>"$LOG" 2>&1 || say "$be: kernels exited $?"
    for m in $MODELS; do
        name=${m%%:*}
        reps=${m##*:}
        t=$(cap); [ "$t" -gt 0 ] || { say "$be: deadline reached, $name skipped"; continue; }
        say "$be: $name (cap ${t}s)"
        timeout "$t" "$bin" bench --models $QFLAG --only "$name" --reps "$reps" --backend "$be" \
            --json "$OUT/parts/$be-$name.json" >>"$LOG" 2>&1 || say "$be: $name exited $?"
    done
    # One file per backend: the parts' results in one array.
    python3 - "$OUT/$be.json" "$OUT"/parts/"$be"-*.json <<'PY' || say "$be: merge failed"
import json, sys
out, parts = sys.argv[1], sys.argv[2:]
merged = {"results": []}
for p in parts:
    try:
        d = json.load(open(p))
    except Exception as e:  # a step killed by its cap leaves no file
        print("skipped", p, e)
        continue
    for k, v in d.items():
        if k != "results":
            merged.setdefault(k, v)
    merged["results"] += d.get("results", [])
json.dump(merged, open(out, "w"), indent=1)
PY
done

if [ "${PROFILE:-1}" = 1 ]; then
    for be in $BACKENDS; do
        case $be in cuda*|wgpu) ;; *) continue ;; esac
        bin=$(binary "$be")
        [ -x "$bin" ] || continue
        mkdir -p "$OUT/profile"
        for name in T_small R_small; do
            t=$(cap); [ "$t" -gt 0 ] || { say "$be: deadline reached, $name profile skipped"; continue; }
            say "$be: $name profiled (cap ${t}s)"
            timeout "$t" "$bin" bench --models $QFLAG --only "$name" --reps 1 --profile \
                --backend "$be" --json "$OUT/profile/$be-$name.json" >>"$LOG" 2>&1 \
                || say "$be: $name profile exited $?"
        done
    done
fi

# Issue 61 item 4: the fused kernels in bf16 at V = 151936 ran at ~0.4 TB/s (f32 at that V:
# 2.3-4.5 TB/s; bf16 at V = 32768: 2.6). Which property of the shape is it? The same kernels
# at a V that is a multiple of 256 (152064) and at half the rows (N = 8192: the logits under
# 4 GiB, 32-bit byte offsets), with every plan printed (RLANY_KERNELS_DEBUG=1). PROBE=0 skips.
if [ "${PROBE:-1}" = 1 ]; then
    for be in $BACKENDS; do
        case $be in cuda*) ;; *) continue ;; esac
        bin=$(binary "$be")
        [ -x "$bin" ] || continue
        mkdir -p "$OUT/profile"
        for n in 16384 8192; do
            t=$(cap); [ "$t" -gt 0 ] || { say "$be: deadline reached, bf16 probe N=$n skipped"; continue; }
            say "$be: bf16 probe at N=$n (cap ${t}s)"
            RLANY_KERNELS_DEBUG=1 timeout "$t" "$bin" bench --kernels --backend "$be" --dtype bf16 \
                --vocab 151936 152064 --n "$n" --reps 5 --json "$OUT/profile/$be-bf16-probe-n$n.json" \
                >>"$OUT/profile/$be-bf16-probe.log" 2>&1 || say "$be: bf16 probe N=$n exited $?"
        done
    done
fi

rm -rf "$OUT/parts"
inputs=()
for f in "$OUT"/*.json; do [ -f "$f" ] && inputs+=(--bench "$f"); done
if [ ${#inputs[@]} -gt 0 ]; then
    bin=$(binary "${BACKENDS%% *}")
    "$bin" report "${inputs[@]}" --out "$OUT/report" >>"$LOG" 2>&1 || say "report exited $?"
fi
say "done"
ls -laR "$OUT" >>"$LOG" 2>&1
# The device returns at most 8 files from $OUT: everything in one archive, the log beside it.
tar czf /tmp/rlany-device-all.tar.gz -C "$OUT" . \
    && find "$OUT" -mindepth 1 -not -name device.log -delete \
    && mv /tmp/rlany-device-all.tar.gz "$OUT/all.tar.gz"
