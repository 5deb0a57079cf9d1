#!/usr/bin/env bash
# Rebuilds the embedded default model from the output of train.py (HF dir) with minfer's own
# converter and quantizer, then measures held-out perplexity of each file.
#   1. here:        python3 tools/train/prepare_corpus.py --train T --heldout H
#   2. GPU machine: python3 tools/train/train.py --train T --heldout H --out OUT
#   3. here:        tools/train/make-default-model.sh OUT/hf
set -euo pipefail
cd "$(dirname "$0")/../.."
hf=${1:?usage: make-default-model.sh HF_DIR}
minfer=${MINFER:-build/minfer}
"$minfer" convert "$hf" -o models/default-f16.gguf --outtype f16
"$minfer" quantize models/default-f16.gguf models/default.gguf q8_0
"$minfer" quantize models/default-f16.gguf models/default-q4_k_m.gguf q4_k_m
for f in default-f16 default default-q4_k_m; do
  echo "== $f"
  "$minfer" perplexity -m models/$f.gguf -f tests/data/kjv-heldout.txt -c 512 --backend cpu
done
