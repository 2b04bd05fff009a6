#!/usr/bin/env bash
# Device call 1: unpack the binary, keep it and the model's first part outside the checkout
# (the machine stays warm for the second call), then the benchmark run.
set -u
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('bench-anchor/rlany.xz'),open('bench-anchor/rlany','wb'))" && chmod +x bench-anchor/rlany
mkdir -p /root/keep && cp bench-anchor/rlany /root/keep/rlany && cp bench-anchor/modelA /root/keep/modelA && rm bench-anchor/modelA
bench-anchor/rlany --version || true
DEADLINE=${DEADLINE:-440} CAP=${CAP:-70} ANCHOR_CAP=${ANCHOR_CAP:-110} bash reports/perf/device.sh
ls -la /root/keep
