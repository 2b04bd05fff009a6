#!/usr/bin/env bash
# Device call 3a (diagnostics): backtraces and kernel profiles of what failed or missed in call 1.
set -u
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('bench-anchor/rlany.xz'),open('/root/keep_rlany','wb'))" 2>/dev/null || { mkdir -p /root/keep; }
mkdir -p /root/keep && mv /root/keep_rlany /root/keep/rlany && chmod +x /root/keep/rlany && cp bench-anchor/modelA /root/keep/modelA
B=/root/keep/rlany
export RUST_BACKTRACE=1
t() { echo "[$(date -u +%T)] $*"; }
t smolshape; timeout 70 $B run bench-anchor/smolshape.ron --backend cuda --no-progress --runs-dir /tmp/r > $OUT/smolshape.log 2>&1; echo "exit $?" >> $OUT/smolshape.log
t T_qwen05b; timeout 40 $B bench --models --only T_qwen05b --reps 1 --backend cuda > $OUT/t_qwen05b.log 2>&1; echo "exit $?" >> $OUT/t_qwen05b.log
t R_qwen05b; timeout 90 $B bench --models --only R_qwen05b --reps 1 --backend cuda > $OUT/r_qwen05b.log 2>&1; echo "exit $? at $(date -u +%T)" >> $OUT/r_qwen05b.log
for w in T_small R_small; do
  t prof $w; CUBECL_DEBUG_LOG=/tmp/prof_$w.txt CUBECL_DEBUG_OPTION=profile timeout 40 $B bench --models --only $w --reps 1 --warmup 1 --backend cuda > /tmp/prof_$w.out 2>&1
  echo "exit $?" >> /tmp/prof_$w.out; cat /tmp/prof_$w.out >> /tmp/prof_$w.txt; gzip -c /tmp/prof_$w.txt > $OUT/prof_$w.txt.gz
done
t done; ls -la $OUT /root/keep
