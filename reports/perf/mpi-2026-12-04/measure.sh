#!/bin/bash
# Issue 46 measurements (reports/perf/NOTES.md §10): the exchange bench between two local
# peers and two MPI ranks, a stress job of 200 002 exchanges with rank 0's descriptors sampled,
# and the quickstart with `shards: 2` alone, as two local peers and as two ranks. Run from the
# repository root on an idle machine, after `cargo build --release --features distributed`.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=${B:-target/release/rlany}
OUT=${OUT:-/tmp/mpi-measure}; rm -rf $OUT /tmp/q; mkdir -p $OUT
echo "== host peers bench $(date)"
$B bench --exchange --peers 2 --reps 3 --json $OUT/exchange-host-2peers.json > $OUT/exchange-host-2peers.md 2>&1
echo "== mpi bench $(date)"
mpirun -n 2 $B bench --exchange --reps 3 --json $OUT/exchange-mpi-2ranks.json > $OUT/exchange-mpi-2ranks.md 2>&1
echo "== stress $(date)"
mpirun -n 2 $B bench --exchange --sizes-m 0.001 --reps 100000 --json $OUT/stress-mpi-2ranks.json > $OUT/stress-mpi-2ranks.md 2>&1 &
J=$!
sleep 1
: > $OUT/stress-fds.txt
while kill -0 $J 2>/dev/null; do
  for p in $(pgrep -P $J); do
    if grep -qz "OMPI_COMM_WORLD_RANK=0" /proc/$p/environ 2>/dev/null; then
      echo "$(date +%s) rank0 fds $(ls /proc/$p/fd 2>/dev/null | wc -l) rss_kb $(grep VmRSS /proc/$p/status | awk '{print $2}')" >> $OUT/stress-fds.txt
    fi
  done
  sleep 2
done
wait $J; echo "stress exit $?" >> $OUT/stress-fds.txt
echo "== quickstart $(date)"
Q="--set shards=2 --set budget.steps=10 --set budget.eval_every=10 --set budget.eval_tasks=64 --set policy.warm_start.steps=300 --no-warm-cache --no-progress"
/usr/bin/time -f "wall %e s maxrss %M KB" $B run experiments/quickstart.ron $Q --runs-dir /tmp/q/alone > $OUT/q-alone.log 2>&1
/usr/bin/time -f "wall %e s maxrss %M KB" $B run experiments/quickstart.ron $Q --peers 2 --runs-dir /tmp/q/peers > $OUT/q-peers.log 2>&1
/usr/bin/time -f "wall %e s" mpirun -n 2 /usr/bin/time -f "rank maxrss %M KB" $B run experiments/quickstart.ron $Q --runs-dir /tmp/q/ranks > $OUT/q-ranks.log 2>&1
for w in alone peers ranks; do cp /tmp/q/$w/quickstart/seed-1/metrics.jsonl $OUT/q-$w.metrics.jsonl; done
echo "== done $(date)"
