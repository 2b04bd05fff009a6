#!/usr/bin/env bash
# Device call 2: the model's second part, then SmolLM2 in the closed loop on CUDA for as many
# steps as fit, with the GPU memory sampled beside it.
set -u
LIMIT=${LIMIT:-200}
mkdir -p models/pretrained
m=models/pretrained/SmolLM2-135M-Instruct.Q4_1.gguf
cat /root/keep/modelA .dev/modelB > $m
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $m" | sha256sum -c || exit 3
nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -lms 1000 > $OUT/gpu_mem.csv 2>&1 &
SMI=$!
start=$(date +%s)
timeout $LIMIT /root/keep/rlany run experiments/pretrained/smollm2_arith.ron --backend cuda --no-progress \
  --set budget.eval_every=5 --set budget.eval_tasks=256 --set budget.checkpoint_every=1000 \
  > $OUT/smollm2_run.log 2>&1
echo "exit $? after $(( $(date +%s) - start )) s" >> $OUT/smollm2_run.log
kill $SMI
d=$(ls -d runs/smollm2_arith/seed-* | head -1)
cp $d/metrics.jsonl $OUT/smollm2_metrics.jsonl 2>/dev/null
tar czf $OUT/smollm2_run.tgz --exclude='*.mpk' --exclude='*checkpoint*' $d 2>/dev/null
ls -la $OUT
