"""llama.cpp's side of reports/perf/llama_cpp.sh: greedy decoding of a GGUF model, one stream
and a batch of rows, timed the way `rlany generate` times itself (prompt processing and
decoding together, every row decoding exactly --tokens tokens). With --share-prompt the rows'
common prompt is read once, as sequence 0, and its cache cells are given to every other row
(`llama_memory_seq_cp`), as rlany's rollout reads a shared prefix once.

Needs `llama-cpp-python` (built from PyPI; see llama_cpp.sh). Prints one JSON object.
"""

import argparse
import json
import time

import llama_cpp
from llama_cpp.llama import Llama
import numpy as np


def greedy(logits_ptr, n_vocab):
    return int(np.ctypeslib.as_array(logits_ptr, shape=(n_vocab,)).argmax())


def add(batch, token, pos, seq, want_logits):
    i = batch.n_tokens
    batch.token[i] = token
    batch.pos[i] = pos
    batch.n_seq_id[i] = 1
    batch.seq_id[i][0] = seq
    batch.logits[i] = 1 if want_logits else 0
    batch.n_tokens = i + 1


def context(model, rows, n_ctx, threads):
    """A context holding `rows` sequences (the high-level `Llama` keeps one)."""
    p = llama_cpp.llama_context_default_params()
    p.n_ctx = n_ctx
    p.n_batch = n_ctx
    p.n_ubatch = 512
    p.n_seq_max = rows
    p.kv_unified = True
    p.n_threads = threads
    p.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(model, p)
    if not ctx:
        raise RuntimeError("llama_init_from_model failed")
    return ctx


def run(ctx, model, prompt_ids, rows, tokens, share):
    """Prompt processing of `rows` copies of the prompt (or of one, its cache cells shared
    by every row, if `share`), then `tokens` greedy decoding steps of every row, batched
    across rows. Returns (seconds, prefill seconds)."""
    n_vocab = llama_cpp.llama_n_vocab(llama_cpp.llama_model_get_vocab(model))
    memory = llama_cpp.llama_get_memory(ctx)
    llama_cpp.llama_memory_clear(memory, True)
    n_prompt = len(prompt_ids)
    batch = llama_cpp.llama_batch_init(max(n_prompt * rows, rows), 0, rows)
    try:
        start = time.perf_counter()
        batch.n_tokens = 0
        for r in range(1 if share else rows):
            for p, t in enumerate(prompt_ids):
                add(batch, t, p, r, p == n_prompt - 1)
        rc = llama_cpp.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed on the prompts ({rc})")
        if share:
            for r in range(1, rows):
                llama_cpp.llama_memory_seq_cp(memory, 0, r, -1, -1)
            # Every row starts from sequence 0's logits (the same prompt, greedy).
            last = [n_prompt - 1] * rows
        else:
            # Each row's logits sit at the index of its last prompt token in the batch.
            last = [r * n_prompt + n_prompt - 1 for r in range(rows)]
        prefill = time.perf_counter() - start
        for k in range(tokens):
            nxt = [greedy(llama_cpp.llama_get_logits_ith(ctx, i), n_vocab) for i in last]
            if k == tokens - 1:
                break
            batch.n_tokens = 0
            for r, t in enumerate(nxt):
                add(batch, t, n_prompt + k, r, True)
            rc = llama_cpp.llama_decode(ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed while decoding ({rc})")
            last = list(range(rows))
        return time.perf_counter() - start, prefill
    finally:
        llama_cpp.llama_batch_free(batch)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-file", required=True, help="the prompt exactly as the model reads it")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--share-prompt", action="store_true",
                    help="read the rows' common prompt once and share its cache cells")
    a = ap.parse_args()
    text = open(a.prompt_file, encoding="utf-8").read()
    llm = Llama(model_path=a.model, n_ctx=512, verbose=False)
    ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
    model = llm._model.model
    ctx = context(model, a.rows, a.rows * (len(ids) + a.tokens + 8), a.threads)
    best = None
    for _ in range(a.repeats):
        secs, prefill = run(ctx, model, ids, a.rows, a.tokens, a.share_prompt and a.rows > 1)
        if best is None or secs < best[0]:
            best = (secs, prefill)
    secs, prefill = best
    print(json.dumps({
        "engine": "llama.cpp",
        "version": llama_cpp.__version__,
        "threads": a.threads,
        "rows": a.rows,
        "prompt_tokens": len(ids),
        "shared_prompt": a.share_prompt and a.rows > 1,
        "tokens_per_row": a.tokens,
        "seconds": secs,
        "prefill_seconds": prefill,
        "tokens_per_s": a.rows * a.tokens / secs,
    }))


if __name__ == "__main__":
    main()
