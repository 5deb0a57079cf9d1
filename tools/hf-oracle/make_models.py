#!/usr/bin/env python3
"""Builds small random HF models and their golden logits for minfer's convert/CPU oracle test.

Needs torch + transformers (the GPU machine has them; no GPU is used). Deterministic: fixed seeds.
For each model writes OUT/<name>/ with config.json, *.safetensors (float32; `llama` sharded with an
index), tokenizer.json + tokenizer_config.json (from ./tokenizer), and golden.json + golden.bin:
  golden.json: {"vocab": V, "prompts": [{"ids": [...], "logits_offset": o, "greedy": [32 ids],
                "min_greedy_margin": m}], "dtype": "float32", "reference": "..."}
  golden.bin:  float32 logits, every prompt position, prompts concatenated ([n_pos, V] each).
Logits come from transformers run in float64 (eager attention), then rounded to float32.
Usage: make_models.py --out DIR
"""
import argparse
import json
import os
import random
import shutil

import numpy as np
import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = 512
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=192, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
              hidden_act="silu", initializer_range=0.1, bos_token_id=509, eos_token_id=511,
              pad_token_id=509, attn_implementation="eager")

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
LINEAR = {"rope_type": "linear", "factor": 4.0}
ROPE = {"qwen2": (1e6, None), "llama": (5e5, LLAMA3), "qwen3": (1e6, None), "mistral": (1e4, None),
        "llama_linear": (1e4, LINEAR)}

MODELS = {
    # Qwen2: q/k/v biases, tied embeddings, NeoX rope.
    "qwen2": (Qwen2ForCausalLM, Qwen2Config(**COMMON, rope_theta=1e6, rms_norm_eps=1e-6,
                                            tie_word_embeddings=True, use_sliding_window=False)),
    # Llama: GQA, llama3 rope scaling (head_dim 16 puts one frequency in the smooth band), sharded.
    "llama": (LlamaForCausalLM, LlamaConfig(**dict(COMMON, max_position_embeddings=131072), rope_theta=5e5,
                                            rms_norm_eps=1e-5, tie_word_embeddings=False,
                                            rope_scaling=dict(LLAMA3))),
    # Qwen3: q/k RMSNorm, head_dim 32 != hidden / heads.
    "qwen3": (Qwen3ForCausalLM, Qwen3Config(**COMMON, head_dim=32, rope_theta=1e6, rms_norm_eps=1e-6,
                                            tie_word_embeddings=False)),
    # Mistral: llama layout under another name.
    "mistral": (MistralForCausalLM, MistralConfig(**COMMON, rope_theta=1e4, rms_norm_eps=1e-5,
                                                  tie_word_embeddings=False, sliding_window=None)),
    # Llama with linear rope scaling and tied embeddings.
    "llama_linear": (LlamaForCausalLM, LlamaConfig(**COMMON, rope_theta=1e4, rms_norm_eps=1e-6,
                                                   tie_word_embeddings=True,
                                                   rope_scaling=dict(LINEAR))),
}


def expected_inv_freq(head_dim, theta, scaling):
    """Rope frequencies from the published formulas and the parameters we meant to set, to catch a
    transformers version that drops or renames a rope setting (the goldens would test the wrong
    thing). transformers 5 keeps them in config.rope_parameters, 4.x in rope_theta/rope_scaling."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    kind = scaling.get("rope_type") if scaling else None
    if kind == "linear":
        return inv / scaling["factor"]
    if kind == "llama3":
        ctx = scaling["original_max_position_embeddings"]
        low_wl, high_wl = ctx / scaling["low_freq_factor"], ctx / scaling["high_freq_factor"]
        out = []
        for f in inv:
            wl = 2 * np.pi / f
            if wl < high_wl:
                out.append(f)
            elif wl > low_wl:
                out.append(f / scaling["factor"])
            else:
                s = (ctx / wl - scaling["low_freq_factor"]) / (scaling["high_freq_factor"] - scaling["low_freq_factor"])
                out.append((1 - s) * f / scaling["factor"] + s * f)
        return np.array(out)
    return inv


def randomize(model, seed):
    """Random weights at a scale that gives logits with clear argmax margins; norms near 1 and
    non-zero biases so every tensor matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() == 1 and "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))


def prompts(seed):
    r = random.Random(seed)
    return [[r.randrange(0, 509) for _ in range(n)] for n in (1, 6, 17, 40)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    for k, (name, (cls, config)) in enumerate(MODELS.items()):
        out = os.path.join(args.out, name)
        os.makedirs(out, exist_ok=True)
        model = cls(config).float().eval()
        randomize(model, 1000 + k)
        got = model.model.rotary_emb.inv_freq.double().numpy()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        want = expected_inv_freq(head_dim, *ROPE[name])
        assert np.allclose(got, want, rtol=1e-5), (name, got, want)
        model.save_pretrained(out, safe_serialization=True,
                              max_shard_size="300KB" if name == "llama" else "100MB")
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(HERE, "tokenizer", f), out)
        model64 = model.double()
        logits_all, meta = [], []
        offset = 0
        for ids in prompts(2000 + k):
            with torch.no_grad():
                logits = model64(torch.tensor([ids])).logits[0]
                seq = list(ids)
                greedy, margins = [], []
                for _ in range(32):
                    last = model64(torch.tensor([seq])).logits[0, -1]
                    top = torch.topk(last, 2)
                    margins.append(float(top.values[0] - top.values[1]))
                    nxt = int(top.indices[0])
                    greedy.append(nxt)
                    seq.append(nxt)
            arr = logits.to(torch.float32).numpy()
            logits_all.append(arr)
            meta.append({"ids": ids, "logits_offset": offset, "greedy": greedy,
                         "min_greedy_margin": min(margins)})
            offset += arr.size
        np.concatenate([a.reshape(-1) for a in logits_all]).astype("<f4").tofile(os.path.join(out, "golden.bin"))
        with open(os.path.join(out, "golden.json"), "w") as f:
            json.dump({"vocab": VOCAB, "dtype": "float32", "prompts": meta,
                       "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, "
                                    f"{cls.__name__}, float64 eager attention"}, f, indent=1)
        print(name, "params", sum(p.numel() for p in model.parameters()),
              "min greedy margin", min(m["min_greedy_margin"] for m in meta),
              "max |logit|", max(float(np.abs(a).max()) for a in logits_all))


if __name__ == "__main__":
    main()
