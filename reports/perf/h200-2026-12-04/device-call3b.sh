#!/usr/bin/env bash
# Device call 3b: SmolLM2's first training step on CUDA with backtraces and the kernel log.
set -u
mkdir -p models/pretrained
m=models/pretrained/SmolLM2-135M-Instruct.Q4_1.gguf
cat /root/keep/modelA .dev/modelB > $m
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $m" | sha256sum -c || exit 3
export RUST_BACKTRACE=1
CUBECL_DEBUG_LOG=/tmp/smol_kernels.txt timeout 80 /root/keep/rlany run experiments/pretrained/smollm2_arith.ron --backend cuda --no-progress --runs-dir /tmp/r \
  --stop-after 2 --set budget.eval_tasks=16 --set budget.eval_every=1000 > $OUT/smol_judge.log 2>&1
echo "exit $?" >> $OUT/smol_judge.log
tail -c 3000000 /tmp/smol_kernels.txt | gzip -c > $OUT/smol_kernels_tail.txt.gz
timeout 50 /root/keep/rlany run .dev/smol_nojudge.ron --backend cuda --no-progress --runs-dir /tmp/r \
  --stop-after 2 --set budget.eval_tasks=16 --set budget.eval_every=1000 > $OUT/smol_nojudge.log 2>&1
echo "exit $?" >> $OUT/smol_nojudge.log
ls -la $OUT
