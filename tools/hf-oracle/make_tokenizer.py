#!/usr/bin/env python3
"""Cuts Qwen3's tokenizer.json down to a 512-token byte-level BPE for the oracle models.

Keeps the 256 byte symbols, the first merges (whose results are ids 256..508) and the
<|endoftext|>, <|im_start|>, <|im_end|> control tokens renumbered to 509..511. The pre-tokenizer,
normalizer and decoder are Qwen's, so the importer sees a real-world tokenizer.json.
Usage: make_tokenizer.py QWEN3_TOKENIZER_DIR OUT_DIR   (python3 stdlib only)
"""
import json
import os
import sys

N_REGULAR = 509  # ids 0..508; three control tokens follow


def main(src, out):
    tok = json.load(open(os.path.join(src, "tokenizer.json"), encoding="utf-8"))
    model = tok["model"]
    vocab = {s: i for s, i in model["vocab"].items() if i < N_REGULAR}
    merges = []
    for m in model["merges"]:
        left, right = m if isinstance(m, list) else m.split(" ", 1)
        if left in vocab and right in vocab and left + right in vocab:
            merges.append([left, right])
    assert len(vocab) == N_REGULAR, len(vocab)
    model["vocab"] = vocab
    model["merges"] = merges
    added = [t for t in tok["added_tokens"] if t["content"] in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")]
    for k, t in enumerate(added):
        t["id"] = N_REGULAR + k
    tok["added_tokens"] = added
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 2048,
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": {
            str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added
        },
        "chat_template": "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
        "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\\n' }}{% endif %}",
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
    print(f"{out}: {len(vocab)} tokens, {len(merges)} merges, {len(added)} control tokens")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
