# The prompt of the GGUF export check (docs/after-training.md): rlany's chat rendering of one
# question, tokenized by the GGUF's own tokenizer through transformers; writes OUT/prompt_ids.json.
import json, sys
from transformers import AutoTokenizer
text = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 7 + 5? Answer with the number only.<|im_end|>\n<|im_start|>assistant\n"
tok = AutoTokenizer.from_pretrained("models/pretrained", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
ids = tok(text, add_special_tokens=False).input_ids
print(len(ids))
json.dump(ids, open(sys.argv[1] + "/prompt_ids.json", "w"))
