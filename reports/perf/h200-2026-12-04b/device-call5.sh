#!/usr/bin/env bash
# Session 4, device call 5 (a fresh machine): keep the fixed CUDA binary (fusion on) and the
# model's first part for call 6.
set -u
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('bench-anchor/rlany.xz'),open('/tmp/rlany','wb'))" && chmod +x /tmp/rlany
mkdir -p /root/keep && mv /tmp/rlany /root/keep/rlany && mv bench-anchor/modelA /root/keep/modelA
ls -la /root/keep
