#!/usr/bin/env bash
# Session 4, device call 1: keep the binary and the model's first part outside the checkout
# (for call 2 on the warm machine), then the two Qwen2.5-0.5B-shaped bf16 workloads that failed
# on 2026-12-04 (T_qwen05b: DTypeMismatch; R_qwen05b: O(V^2) cumsum), re-measured after the fixes.
set -u
S=$(date +%s)
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('bench-anchor/rlany.xz'),open('/tmp/rlany','wb'))" && chmod +x /tmp/rlany
mkdir -p /root/keep && mv /tmp/rlany /root/keep/rlany && mv bench-anchor/modelA /root/keep/modelA
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/qwen.log
B=/root/keep/rlany
for w in T_qwen05b:5:80 R_qwen05b:3:100; do
  IFS=: read name reps cap <<< "$w"
  echo "== $name (cap ${cap}s) at $(( $(date +%s) - S )) s" >> $OUT/qwen.log
  RUST_BACKTRACE=1 timeout $cap $B bench --models --only $name --reps $reps --warmup 1 --backend cuda \
    --json $OUT/$name.json >> $OUT/qwen.log 2>&1
  echo "exit $? at $(( $(date +%s) - S )) s" >> $OUT/qwen.log
done
ls -la /root/keep >> $OUT/qwen.log
