#!/usr/bin/env bash
# Session 4, device call 4: the same tiny LoRA step with Burn's fusion compiled out (call 2
# traced the failing launch to a fused element-wise kernel); if it runs, the learning run and
# a short bf16 run on that binary.
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
echo "== tiny (no fusion) at $(( $(date +%s) - S )) s" >> $OUT/diag.log
timeout 90 $B run $F --backend cuda --no-progress --runs-dir /tmp/r-tiny --stop-after 2 $TINY >> $OUT/diag.log 2>&1
rc=$?; echo "exit $rc at $(( $(date +%s) - S )) s" >> $OUT/diag.log
if [ $rc = 0 ]; then
  t=$(( $(left) - 100 ))
  echo "== learning run, cap ${t}s, at $(( $(date +%s) - S )) s" >> $OUT/diag.log
  timeout $t $B run $F --backend cuda --no-progress --runs-dir /tmp/learn \
    --set budget.eval_every=3 --set budget.eval_tasks=256 --set budget.checkpoint_every=1000 > $OUT/smollm2_run.log 2>&1
  echo "exit $? after $(( $(date +%s) - S )) s" >> $OUT/smollm2_run.log
  cp /tmp/learn/smollm2_arith/seed-1/metrics.jsonl $OUT/smollm2_metrics.jsonl
  t=$(( $(left) - 3 ))
  echo "== bf16 run, cap ${t}s, at $(( $(date +%s) - S )) s" >> $OUT/diag.log
  timeout $t $B run $F --backend cuda --no-progress --runs-dir /tmp/bf16 --stop-after 3 \
    --set policy.model.dtype=Bf16 --set judge.model.dtype=Bf16 \
    --set budget.eval_tasks=256 --set budget.eval_every=1000 > $OUT/bf16_run.log 2>&1
  echo "exit $? after $(( $(date +%s) - S )) s" >> $OUT/bf16_run.log
  cp /tmp/bf16/smollm2_arith/seed-1/metrics.jsonl $OUT/bf16_metrics.jsonl
fi
kill $SMI
