#!/usr/bin/env bash
# The LLVM that Burn 0.22's CUDA build links, from PyPI instead of GitHub.
#
#   bash kernels/cuda-llvm.sh [--check] [BUNDLER_VERSION ...]
#
# burn-cuda 0.22 depends on cubecl-cuda 0.11, which always builds cubecl-llvm (its default
# kernel compiler lowers through LLVM's NVPTX backend to PTX). cubecl-llvm links a static LLVM
# 23.1 that the build script of `tracel-llvm-bundler` downloads from GitHub releases into
# `${XDG_DATA_HOME:-~/.local/share}/tracel/tracel-llvm-<version>/` — unless a file
# `.tracel-llvm-installed` is already there, in which case it reads that folder's
# `bin/llvm-config` and links what it names. A machine that reaches only the package
# registries (or a proxy that allows them) fails at the download.
#
# This script lays out the same LLVM release from PyPI instead: `mlc-llvm-static` 23.1.1
# (static libraries, headers and a Python `llvm-config`; the X86 backend) and
# `mlc-llvm-static-extra-targets` (every other backend, NVPTX among them, from the same
# build), both checked against their SHA-256, unpacked into
# `<data>/tracel/mlc-llvm-static-23.1.1.post0/`, and linked as `tracel-llvm-<version>` for each
# bundler version of LLVM 23.1: the ones given, else those in the workspace's and the probe's
# Cargo.lock, else 23.1.0-4 (what burn 0.22.1 resolves to today). A folder of that name that is not this script's link (a bundle
# already downloaded) is left alone. Run it again: it does nothing that is done.
#
# --check then builds kernels/cuda-probe (burn 0.22.1 with `cuda`, one tensor op) in release
# into a target folder of its own, which is what fails without the LLVM; it needs no GPU
# and no CUDA toolkit (CUDARC_CUDA_VERSION, default 13000, names the CUDA API to bind).
#
# Needs: python3 >= 3.10 with pip (the wheels and their llvm-config), a C++ compiler (which
# cubecl-llvm needs anyway), 400 MB of disk.
set -euo pipefail
cd "$(dirname "$0")/.."

check=0
versions=()
for a in "$@"; do
    case $a in
        --check) check=1 ;;
        -*) echo "unknown option $a (usage: bash kernels/cuda-llvm.sh [--check] [BUNDLER_VERSION ...])" >&2; exit 2 ;;
        *) versions+=("$a") ;;
    esac
done
if [ ${#versions[@]} -eq 0 ]; then
    for lock in Cargo.lock kernels/cuda-probe/Cargo.lock; do
        [ -f "$lock" ] || continue
        while read -r v; do versions+=("$v"); done < <(
            awk '/^name = "tracel-llvm-bundler"$/ { getline; gsub(/version = |"/, ""); print }' "$lock")
    done
fi
# Only the bundlers of LLVM 23.1 (cubecl-llvm 0.11's); burn 0.21's lock also names 20.1.4-7,
# the LLVM 20 of an MLIR CPU backend this workspace does not build.
mapfile -t versions < <(printf '%s\n' "${versions[@]}" | grep '^23\.1\.' | sort -u)
[ ${#versions[@]} -gt 0 ] || versions=(23.1.0-4)

if [ "$(uname -s)-$(uname -m)" != Linux-x86_64 ]; then
    echo "the pinned wheels are Linux x86-64 ones; on $(uname -s)-$(uname -m) let the build download its LLVM, or lay out an LLVM 23.1 with NVPTX at ${XDG_DATA_HOME:-~/.local/share}/tracel/tracel-llvm-<version>/ with a .tracel-llvm-installed file" >&2
    exit 1
fi
python=$(command -v python3 || command -v python)
data=${XDG_DATA_HOME:-$HOME/.local/share}/tracel
release=23.1.1.post0
sdk=$data/mlc-llvm-static-$release
base_sha=dcfec888abfaa418be77d41af585805f31463584cf9c90582992c00f392c1ac5
extra_sha=c36e834d9a4e9cf9759f27fece65711ece7a2fc2b5a96dbb15d66f5e9e787929

if [ -f "$sdk/.tracel-llvm-installed" ]; then
    echo "LLVM $release is already at $sdk"
else
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    echo "downloading mlc-llvm-static $release and its extra targets from PyPI (92 MB)"
    "$python" -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" \
        --platform manylinux_2_28_x86_64 \
        "mlc-llvm-static==$release" "mlc-llvm-static-extra-targets==$release"
    echo "$base_sha  $tmp/mlc_llvm_static-$release-py3-none-manylinux_2_28_x86_64.whl" | sha256sum -c --quiet
    echo "$extra_sha  $tmp/mlc_llvm_static_extra_targets-$release-py3-none-manylinux_2_28_x86_64.whl" | sha256sum -c --quiet
    rm -rf "$sdk.part" && mkdir -p "$sdk.part"
    "$python" - "$sdk.part" "$tmp"/*.whl <<'PY'
import os, sys, zipfile
out, wheels = sys.argv[1], sys.argv[2:]
prefix = "mlc_llvm_static/static/"
for wheel in wheels:
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if info.is_dir() or not info.filename.startswith(prefix):
                continue
            dest = os.path.join(out, info.filename[len(prefix):])
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(info) as src, open(dest, "wb") as dst:
                dst.write(src.read())
            if info.filename.endswith("/bin/llvm-config") or info.filename.endswith(".py"):
                os.chmod(dest, 0o755)
PY
    targets=$("$sdk.part/bin/llvm-config" --targets-built)
    case " $targets " in
        *" NVPTX "*) ;;
        *) echo "the unpacked LLVM has no NVPTX backend (targets: $targets)" >&2; exit 1 ;;
    esac
    touch "$sdk.part/.tracel-llvm-installed"
    rm -rf "$sdk" && mv "$sdk.part" "$sdk"
    echo "LLVM $("$sdk/bin/llvm-config" --version) unpacked at $sdk"
fi

for v in "${versions[@]}"; do
    link=$data/tracel-llvm-$v
    if [ -e "$link" ] && [ ! -L "$link" ]; then
        echo "$link is a downloaded bundle: left as it is"
        continue
    fi
    ln -sfn "$sdk" "$link"
    echo "tracel-llvm-bundler $v will link $link -> $sdk"
done

if [ $check -eq 1 ]; then
    target=${PROBE_TARGET_DIR:-$PWD/kernels/cuda-probe/target}
    echo "building kernels/cuda-probe (burn 0.22.1, cuda) in release into $target"
    (cd kernels/cuda-probe && CUDARC_CUDA_VERSION=${CUDARC_CUDA_VERSION:-13000} \
        CARGO_TARGET_DIR=$target cargo build --release --locked)
    echo "the CUDA build links: $target/release/cuda-probe"
fi
