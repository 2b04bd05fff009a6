#!/usr/bin/env bash
# Session 4, device call 2 (the machine still warm from call 1): SmolLM2-135M with LoRA in the
# closed loop on CUDA. First a tiny step (did the sampler fix end the CUDA_ERROR_INVALID_VALUE
# of 2026-12-04?); then, if it ran, the learning run for the time left and a short bf16 run;
# if it failed, variants that isolate the failing path.
set -u
S=$(date +%s)
DEADLINE=${DEADLINE:-400}
left() { echo $(( DEADLINE - ($(date +%s) - S) )); }
mkdir -p models/pretrained
m=models/pretrained/SmolLM2-135M-Instruct.Q4_1.gguf
cat /root/keep/modelA .dev/modelB > $m
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $m" | sha256sum -c || exit 3
B=/root/keep/rlany
export RUST_BACKTRACE=1
F=experiments/pretrained/smollm2_arith.ron
nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -lms 1000 > $OUT/gpu_mem.csv 2>&1 &
SMI=$!
TINY="--set budget.tasks_per_step=4 --set budget.group_size=4 --set budget.eval_tasks=16 --set judge.warm_start.steps=2"
try() { # name cap args...: one short run, its log in $OUT/diag.log
  local name=$1 cap=$2; shift 2
  echo "== $name at $(( $(date +%s) - S )) s: $*" >> $OUT/diag.log
  timeout $cap $B run $F --backend cuda --no-progress --runs-dir /tmp/r-$name --stop-after 1 "$@" >> $OUT/diag.log 2>&1
  local rc=$?; echo "exit $rc at $(( $(date +%s) - S )) s" >> $OUT/diag.log; return $rc
}
if try tiny 90 $TINY; then
  t=$(( $(left) - 110 ))
  echo "== learning run, cap ${t}s" >> $OUT/diag.log
  timeout $t $B run $F --backend cuda --no-progress --runs-dir /tmp/learn \
    --set budget.eval_every=5 --set budget.eval_tasks=256 --set budget.checkpoint_every=1000 > $OUT/smollm2_run.log 2>&1
  echo "exit $? after $(( $(date +%s) - S )) s" >> $OUT/smollm2_run.log
  cp /tmp/learn/smollm2_arith/seed-1/metrics.jsonl $OUT/smollm2_metrics.jsonl
  t=$(( $(left) - 5 ))
  echo "== bf16 run, cap ${t}s" >> $OUT/diag.log
  timeout $t $B run $F --backend cuda --no-progress --runs-dir /tmp/bf16 --stop-after 3 \
    --set policy.model.dtype=Bf16 --set judge.model.dtype=Bf16 \
    --set budget.eval_tasks=256 --set budget.eval_every=1000 > $OUT/bf16_run.log 2>&1
  echo "exit $? after $(( $(date +%s) - S )) s" >> $OUT/bf16_run.log
  cp /tmp/bf16/smollm2_arith/seed-1/metrics.jsonl $OUT/bf16_metrics.jsonl
else
  try nojudge-greedy 60 $TINY --set judge=None --set policy.sampling.temperature=0.0
  try nojudge-sampled 60 $TINY --set judge=None
  try nojudge-greedy-nolora 60 $TINY --set judge=None --set policy.sampling.temperature=0.0 --set policy.model.lora=null
  CUBECL_DEBUG_LOG=/tmp/k.txt try kernels $(( $(left) - 10 )) $TINY --set judge=None
  tail -c 4000000 /tmp/k.txt | gzip -c > $OUT/kernels_tail.txt.gz
fi
kill $SMI
