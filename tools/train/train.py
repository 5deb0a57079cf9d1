#!/usr/bin/env python3
"""Trains minfer's embedded default model on the KJV: a byte-level BPE tokenizer (HF tokenizers)
and a small Qwen2-architecture model (GQA, tied embeddings), then writes HF files and golden
float32 logits + greedy continuations for minfer's tests. Runs on the GPU machine in minutes."""
import argparse
import json
import math
import os
import random
import struct
import time

import numpy as np
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

# Qwen2's split pattern, so minfer's HF import recognises the pre-tokenizer family.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
          " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
          "{% endif %}")
PROMPTS = ["In the beginning God created",
           "And the LORD said unto Moses,",
           "Blessed are the poor in spirit: for"]


def train_tokenizer(train_text, vocab_size, out_dir):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([train_text], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", bos_token=None)
    fast.chat_template = CHATML
    fast.save_pretrained(out_dir)
    return fast


def batches(ids, seq, batch, rng):
    n = (len(ids) - 1) // seq
    starts = [i * seq for i in range(n)]
    while True:
        rng.shuffle(starts)
        for b in range(0, len(starts) - batch + 1, batch):
            idx = torch.tensor([ids[s:s + seq + 1] for s in starts[b:b + batch]])
            yield idx[:, :-1], idx[:, 1:]


@torch.no_grad()
def heldout_loss(model, ids, seq, device):
    model.eval()
    total, count = 0.0, 0
    for s in range(0, len(ids) - 1 - seq, seq):
        x = torch.tensor(ids[s:s + seq + 1], device=device)[None]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x[:, :-1]).logits.float()
        total += torch.nn.functional.cross_entropy(logits[0], x[0, 1:], reduction="sum").item()
        count += seq
    model.train()
    return total / count


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--minutes", type=float, default=4.0, help="training time budget")
    args = ap.parse_args()

    random.seed(0); np.random.seed(0); torch.manual_seed(0)
    device = "cuda"
    hf_dir = os.path.join(args.out, "hf")
    os.makedirs(hf_dir, exist_ok=True)
    train_text = open(args.train).read()
    held_text = open(args.heldout).read()
    t0 = time.time()
    tok = train_tokenizer(train_text, args.vocab, hf_dir)
    train_ids = tok(train_text)["input_ids"]
    held_ids = tok(held_text)["input_ids"]
    print(f"tokenizer: {len(tok)} tokens, train {len(train_ids)} ids, held-out {len(held_ids)} ids "
          f"({time.time() - t0:.1f}s)", flush=True)

    cfg = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, max_position_embeddings=2048,
                      rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                      attention_dropout=0.0, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                      bos_token_id=None, pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"))
    model = Qwen2ForCausalLM(cfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = 100
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps)))
    data = batches(train_ids, args.seq, args.batch, random.Random(0))
    best, best_step, log = float("inf"), -1, []
    t_train = time.time()
    for step in range(args.steps):
        x, y = next(data)
        x, y = x.to(device), y.to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, args.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(); sched.step()
        out_of_time = time.time() - t_train > args.minutes * 60
        if step % 100 == 0 or step == args.steps - 1 or out_of_time:
            hl = heldout_loss(model, held_ids, args.seq, device)
            log.append({"step": step, "train_loss": loss.item(), "heldout_loss": hl,
                        "seconds": round(time.time() - t_train, 1)})
            print(json.dumps(log[-1]), flush=True)
            if hl < best:
                best, best_step = hl, step
                model.save_pretrained(hf_dir, safe_serialization=True, max_shard_size="15MB")
        if out_of_time:
            break
    print(f"best held-out loss {best:.4f} (ppl {math.exp(best):.2f}) at step {best_step}", flush=True)

    # Golden data from the saved (best) checkpoint in float32 (no TF32).
    torch.backends.cuda.matmul.allow_tf32 = False
    model = Qwen2ForCausalLM.from_pretrained(hf_dir).float().to(device).eval()
    goldens = {"n_vocab": args.vocab, "prompts": []}
    with open(os.path.join(args.out, "golden_logits.bin"), "wb") as blob:
        for p in PROMPTS:
            ids = tok(p)["input_ids"]
            with torch.no_grad():
                logits = model(torch.tensor([ids], device=device)).logits[0].float().cpu().numpy()
                seq = list(ids)
                for _ in range(64):  # plain greedy, no stop token: minfer's tests compare all 64
                    nxt = model(torch.tensor([seq], device=device)).logits[0, -1].argmax().item()
                    seq.append(nxt)
            cont = seq[len(ids):]
            goldens["prompts"].append({"text": p, "ids": ids, "logits_offset": blob.tell() // 4,
                                       "greedy": cont, "greedy_text": tok.decode(cont)})
            blob.write(logits.astype("<f4").tobytes())
    goldens.update({"heldout_loss": best, "best_step": best_step, "n_params": n_params,
                    "config": {k: getattr(args, k) for k in ("vocab", "hidden", "layers", "heads",
                               "kv_heads", "ffn", "seq", "batch", "lr", "steps")},
                    "log": log})
    json.dump(goldens, open(os.path.join(args.out, "golden.json"), "w"), indent=1)
    for g in goldens["prompts"]:
        print(repr(g["text"] + g["greedy_text"]))


if __name__ == "__main__":
    main()
