"""The tokenizer an `rlany export --format hf` writes for a policy that came from a GGUF file,
checked against transformers' own reading of the same GGUF file (by hand, with transformers
in a virtual environment):

    python check_hf_tokenizer.py OUT_DIR GGUF_DIR GGUF_FILE

prints how many of a set of texts encode to the same ids, whether the chat template renders
the same prompt, whether decoding gives the texts back, and the special tokens.
"""
import sys

from transformers import AutoTokenizer

out_dir, gguf_dir, gguf_file = sys.argv[1:4]
ours = AutoTokenizer.from_pretrained(out_dir)
ref = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
texts = ["What is 7 + 5?", "The capital of France is Paris.", "  leading spaces and\ttabs\n\nnewlines",
         "numbers 1234567 and 3.14159", "émoji 🤖 and ünïcödé", "<|im_start|>user\nhi<|im_end|>",
         "don't you'll I'm", "x" * 50, "Ġweird Ċ tokens", "code: fn main() { println!(\"hi\"); }"]
same = sum(ours.encode(t) == ref.encode(t) for t in texts)
print(f"encode: {same} / {len(texts)} texts give the same ids")
msgs = [{"role": "user", "content": "What is 7 + 5?"}]
a = ours.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
b = ref.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
print("chat template renders the same:", a == b)
print("decode round trip:", all(ours.decode(ours.encode(t)) == t for t in texts))
print("bos/eos/pad:", ours.bos_token, ours.eos_token, ours.pad_token)
