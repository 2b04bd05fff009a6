#!/usr/bin/env bash
# rlany against llama.cpp, the reference CPU engine, side by side on this machine: the same
# GGUF file, the same prompt (the chat template rendered by `rlany generate --show-prompt`,
# fed to llama.cpp as text), the same number of threads, greedy decoding of exactly TOKENS
# tokens per row (end-of-message ignored), prompt processing included in both timings, the
# faster of REPEATS runs of each. The table names the CPU.
#
# Workloads per thread count:
#   single         one stream, as `rlany generate` (TOKENS tokens): rlany multiplies by the
#                  GGUF's quantized blocks, as llama.cpp does (rlany_models::packed)
#   single-dense   the same stream, rlany on its f32 weights (`generate --dense`), against the
#                  same llama.cpp measurement
#   batch          ROWS copies of the prompt decoded together, as a rollout (BATCH_TOKENS
#                  each); llama.cpp reads the prompt once per row
#   batch-shared   the same, llama.cpp reading the common prompt once and sharing its cache
#                  cells with every row (`llama_memory_seq_cp`). rlany reads a prefix common
#                  to fresh rows once in both, so this is the like-for-like batch row.
#   ppo-update     rlany only: `rlany bench --models --only T_smollm2_lora`, the PPO update of
#                  the SmolLM2 LoRA file (8 rows of 128 tokens; GFLOP/s of its dense products)
#
# rlany uses T threads on a batch as a run with `shards: T` does: the rows in T groups, each
# on its own thread (`generate --shards`, `bench --shards`); SHARDS=1 keeps one group (the
# products' own threads only; also for binaries older than --shards).
#
# Usage: reports/perf/llama_cpp.sh [RLANY_BINARY]       (default target/release/rlany)
# Environment:
#   MODEL         the GGUF file (default models/pretrained/SmolLM2-135M-Instruct.Q4_1.gguf)
#   PY            a Python with llama-cpp-python, built from PyPI for the CPU's own
#                 instruction sets (a native build has used AMX on these machines and died
#                 with "Illegal instruction"); -DGGML_AVX512=ON only where /proc/cpuinfo
#                 lists avx512f:
#                 CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
#                   -DGGML_AVX512=OFF" python3 -m pip install llama-cpp-python
#   BACKEND       rlany's backend (default ndarray; flex needs a build with --features flex)
#   THREADS       thread counts to compare (default "1 2")
#   SHARDS        row groups on a batch: "threads" (default: one per thread) or a number
#   PPO_REPS      timed PPO updates per thread count (default 3; 0 skips the ppo-update row)
#   TOKENS ROWS BATCH_TOKENS   (default 64, 32, 32)
#   REPEATS       runs of each measurement, the fastest kept, for both engines (default 2)
#   OUT           output folder (default reports/perf/llama_cpp): results.jsonl, table.md
set -euo pipefail
cd "$(dirname "$0")/../.."
# The binary is started directly, not by `cargo run`, so it does not get .cargo/config.toml's
# allocator setting: keep freed memory for the next step, as every `cargo run` does (without
# it the kernel re-zeroes the decode's large buffers each step: 9x the page faults and
# 1-2 s of system time on the 32-row batch; NOTES.md §6, §9i).
export MIMALLOC_PURGE_DELAY=${MIMALLOC_PURGE_DELAY:--1}
BIN=${1:-target/release/rlany}
MODEL=${MODEL:-models/pretrained/SmolLM2-135M-Instruct.Q4_1.gguf}
PY=${PY:-python3}
BACKEND=${BACKEND:-ndarray}
THREADS=${THREADS:-1 2}
TOKENS=${TOKENS:-64}
ROWS=${ROWS:-32}
BATCH_TOKENS=${BATCH_TOKENS:-32}
SHARDS=${SHARDS:-threads}
PPO_REPS=${PPO_REPS:-3}
REPEATS=${REPEATS:-2}
OUT=${OUT:-reports/perf/llama_cpp}
MESSAGE="Write a short story about a robot who learns to paint."

[ -x "$BIN" ] || { echo "no rlany binary at $BIN (cargo build --release)" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "no model at $MODEL (bash models/fetch-smollm2.sh)" >&2; exit 2; }
"$PY" -c 'import llama_cpp' 2>/dev/null || {
    echo "$PY has no llama_cpp module; see the header of $0 for the build" >&2; exit 2; }
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# The prompt exactly as rlany's model reads it.
"$BIN" generate "$MODEL" --prompt "$MESSAGE" --max-tokens 1 --show-prompt 2>"$TMP/show" >/dev/null
"$PY" - "$TMP/show" "$TMP/prompt.txt" <<'EOF'
import sys
s = open(sys.argv[1], encoding="utf-8").read()
a = s.index("--- prompt ---\n") + len("--- prompt ---\n")
open(sys.argv[2], "w", encoding="utf-8").write(s[a:s.index("--- end of prompt ---", a)])
EOF

shards_for() { # threads rows
    local s=$SHARDS
    [ "$s" = threads ] && s=$1
    if [ "$2" -gt 1 ] && [ "$s" -gt 1 ]; then echo "$s"; else echo 1; fi
}

# One rlany measurement as a JSON line (its own stderr summary, parsed): the faster of
# REPEATS runs, as llamacpp_side.py keeps the faster of its repeats.
ours() { # threads rows tokens [--dense]
    local t=$1 rows=$2 n=$3 shards
    shards=$(shards_for "$t" "$rows")
    local flag=(${4:-})
    [ "$shards" -gt 1 ] && flag+=(--shards "$shards")
    : >"$TMP/err"
    for _ in $(seq "$REPEATS"); do
        RAYON_NUM_THREADS=$t MATMUL_NUM_THREADS=$t "$BIN" generate "$MODEL" --prompt "$MESSAGE" \
            --max-tokens "$n" --ignore-eos --batch "$rows" --backend "$BACKEND" "${flag[@]}" \
            2>>"$TMP/err" >/dev/null
    done
    "$PY" - "$TMP/err" "$t" "$rows" "$n" "$BACKEND" "$shards" <<'EOF'
import json, re, sys
s = open(sys.argv[1], encoding="utf-8").read()
runs = re.findall(r"prompt (\d+) tokens, (?:\d+ rows, )?reply (\d+) tokens in ([\d.]+) s \(([\d.]+) tokens/s\).*peak memory (\d+) MiB", s)
if not runs:
    sys.exit("could not read rlany's summary:\n" + s)
m = max(runs, key=lambda r: float(r[3]))
m = (None,) + m
print(json.dumps({"engine": "rlany", "backend": sys.argv[5], "threads": int(sys.argv[2]), "rows": int(sys.argv[3]), "shards": int(sys.argv[6]),
                  "prompt_tokens": int(m[1]), "tokens_per_row": int(sys.argv[4]),
                  "seconds": float(m[3]), "tokens_per_s": float(m[4]), "peak_mib": int(m[5])}))
EOF
}

theirs() { # threads rows tokens [--share-prompt]
    "$PY" reports/perf/llamacpp_side.py --model "$MODEL" --prompt-file "$TMP/prompt.txt" \
        --threads "$1" --rows "$2" --tokens "$3" --repeats "$REPEATS" ${4:-} 2>/dev/null
}

: >"$OUT/results.jsonl"
for t in $THREADS; do
    for w in single batch; do
        if [ $w = single ]; then rows=1 n=$TOKENS; else rows=$ROWS n=$BATCH_TOKENS; fi
        echo "threads $t, $w ($rows x $n tokens)" >&2
        ours "$t" "$rows" "$n" | sed "s/^{/{\"workload\": \"$w\", /" >>"$OUT/results.jsonl"
        theirs "$t" "$rows" "$n" | sed "s/^{/{\"workload\": \"$w\", /" >>"$OUT/results.jsonl"
    done
    echo "threads $t, single-dense (1 x $TOKENS tokens, rlany --dense only)" >&2
    ours "$t" 1 "$TOKENS" --dense | sed "s/^{/{\"workload\": \"single-dense\", /" >>"$OUT/results.jsonl"
    echo "threads $t, batch-shared ($ROWS x $BATCH_TOKENS tokens, llama.cpp only)" >&2
    theirs "$t" "$ROWS" "$BATCH_TOKENS" --share-prompt \
        | sed "s/^{/{\"workload\": \"batch-shared\", /" >>"$OUT/results.jsonl"
    if [ "$PPO_REPS" -gt 0 ]; then
        shards=$(shards_for "$t" 8)
        echo "threads $t, ppo-update (T_smollm2_lora, $shards shard(s), rlany only)" >&2
        RAYON_NUM_THREADS=$t MATMUL_NUM_THREADS=$t "$BIN" bench --models --quick \
            --only T_smollm2_lora --backend "$BACKEND" --reps "$PPO_REPS" --shards "$shards" \
            --json "$TMP/ppo.json" >/dev/null
        "$PY" - "$TMP/ppo.json" "$t" "$shards" "$BACKEND" >>"$OUT/results.jsonl" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
print(json.dumps({"workload": "ppo-update", "engine": "rlany", "backend": sys.argv[4], "threads": int(sys.argv[2]),
                  "shards": int(sys.argv[3]), "rows": 8, "tokens_per_row": 128, "seconds": r["median_ms"] / 1e3,
                  "tokens_per_s": r["tokens_per_s"], "gflop_per_s": r["gflop_per_s"]}))
EOF
    fi
done

CPU=$(grep -m1 "model name" /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')
ISA=$(grep -m1 -o -w "avx512f" /proc/cpuinfo 2>/dev/null || echo "no avx512f")
"$PY" - "$OUT/results.jsonl" "$OUT/table.md" "${CPU:-$(uname -m)} ($ISA), $(nproc) cores" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
key = lambda r: (r["threads"], r["workload"])
ours = {key(r): r for r in rows if r["engine"] == "rlany"}
ref = {key(r): r for r in rows if r["engine"] == "llama.cpp"}
out = ["| backend | threads | workload | rlany tokens/s | llama.cpp tokens/s | ratio |", "|---|---|---|---|---|---|"]
# rlany reads a common prefix once in either batch row: one measurement serves both; its
# dense single stream is set against llama.cpp's single stream.
pairs = [(k, k[1]) for k in ref] + [((k[0], "single-dense"), "single") for k in ref if k[1] == "single"]
for (t, w), theirs in sorted(pairs):
    o, r = ours.get((t, "batch" if w == "batch-shared" else w)), ref[(t, theirs)]
    if o is None:
        continue
    out.append(f"| {o.get('backend', 'ndarray')} | {t} | {w} ({o['rows']} × {o['tokens_per_row']}) | {o['tokens_per_s']:.1f} | "
               f"{r['tokens_per_s']:.1f} | {o['tokens_per_s'] / r['tokens_per_s']:.2f}× |")
# Each rlany workload at every thread count against its fewest threads: the second core's gain.
scale = ["", "| workload | threads | shards | rlany tokens/s | against its fewest threads | GFLOP/s |", "|---|---|---|---|---|---|"]
runs = [r for r in rows if r["engine"] == "rlany"]
for r in sorted(runs, key=lambda r: (r["workload"], r["threads"])):
    base = min((b for b in runs if b["workload"] == r["workload"]), key=lambda b: b["threads"])
    g = f"{r['gflop_per_s']:.1f}" if r.get("gflop_per_s") is not None else "-"
    scale.append(f"| {r['workload']} | {r['threads']} | {r.get('shards', 1)} | {r['tokens_per_s']:.1f} | "
                 f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}× | {g} |")
out += scale
open(sys.argv[2], "w").write(f"Machine: {sys.argv[3]}; prompt {rows[0]['prompt_tokens']} tokens.\n\n" + "\n".join(out) + "\n")
print("\n".join(out))
EOF
