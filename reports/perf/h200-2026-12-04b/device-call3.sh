#!/usr/bin/env bash
# Session 4, device call 3: keep the no-fusion CUDA binary and the model's first part for call 4.
set -u
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('bench-anchor/rlany-nofusion.xz'),open('/tmp/rlany','wb'))" && chmod +x /tmp/rlany
mkdir -p /root/keep && mv /tmp/rlany /root/keep/rlany && mv bench-anchor/modelA /root/keep/modelA
ls -la /root/keep; /root/keep/rlany --version
