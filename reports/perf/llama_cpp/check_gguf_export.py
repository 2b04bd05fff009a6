"""Check rlany's GGUF exports against the hf export (f32, adapters merged) with two independent
readers: transformers' GGUF loader and (when installed) llama.cpp through llama-cpp-python."""
import json, sys, os
import numpy as np

out = sys.argv[1]            # folder with hf/, model-f16.gguf, model-q8_0.gguf
prompt_ids = json.load(open(os.path.join(out, "prompt_ids.json")))
result = {}
try:
    import torch
    from transformers import AutoModelForCausalLM
    ids = torch.tensor([prompt_ids])
    ref_model = AutoModelForCausalLM.from_pretrained(os.path.join(out, "hf"), torch_dtype=torch.float32)
    with torch.no_grad():
        ref = ref_model(ids).logits[0].numpy()
        gen = ref_model.generate(ids, max_new_tokens=24, do_sample=False)[0, len(prompt_ids):].tolist()
    result["hf_greedy_ids"] = gen
    json.dump(gen, open(os.path.join(out, "hf_greedy_ids.json"), "w"))
    for q in ["f16", "q8_0"]:
        m = AutoModelForCausalLM.from_pretrained(out, gguf_file=f"model-{q}.gguf", torch_dtype=torch.float32)
        with torch.no_grad():
            lg = m(ids).logits[0].numpy()
            g = m.generate(ids, max_new_tokens=24, do_sample=False)[0, len(prompt_ids):].tolist()
        result[f"transformers_{q}"] = {"max_abs_logit_diff": float(np.abs(lg - ref).max()),
                                       "argmax_agree": float((lg.argmax(-1) == ref.argmax(-1)).mean()),
                                       "greedy_same": g == gen}
    np.save(os.path.join(out, "ref_logits.npy"), ref)
except ImportError as e:
    result["transformers"] = f"not installed: {e}"
try:
    from llama_cpp import Llama
    ref = np.load(os.path.join(out, "ref_logits.npy"))
    gen = json.load(open(os.path.join(out, "hf_greedy_ids.json")))
    for q in ["f16", "q8_0"]:
        llm = Llama(model_path=os.path.join(out, f"model-{q}.gguf"), logits_all=True, n_ctx=512,
                    verbose=False, n_threads=2)
        llm.eval(prompt_ids)
        lg = np.array(llm.scores[: len(prompt_ids)])
        # greedy continuation
        toks = []
        llm.reset()
        for t in llm.generate(prompt_ids, temp=0.0, top_k=1, reset=True):
            if t == llm.token_eos() or len(toks) >= 24:
                break
            toks.append(t)
        n = min(len(toks), len(gen or []))
        result[f"llama_cpp_{q}"] = {"max_abs_logit_diff": float(np.abs(lg - ref).max()),
                                    "argmax_agree": float((lg.argmax(-1) == ref.argmax(-1)).mean()),
                                    "greedy_ids": toks, "greedy_same_prefix": toks[:n] == (gen or [])[:n],
                                    "text": llm.detokenize(toks).decode("utf-8", "replace")}
except ImportError as e:
    result["llama_cpp"] = f"not installed: {e}"
print(json.dumps(result, indent=1))
