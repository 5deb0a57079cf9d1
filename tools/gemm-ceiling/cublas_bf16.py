#!/usr/bin/env python3
"""The card's bf16 tensor-core ceiling at the shapes of the backend's prompt GEMMs: cuBLAS (through
torch.matmul) on bf16 activations [m, k] times bf16 weights [k, n] with f32 accumulation, the
reference that issue 12 measures the prefill GEMM against in the same run.

The shapes come from minfer itself: `minfer synth --preset P --ftype q4_k_m --tokenizer builtin
--dry-run` lists the tensors; every distinct (matrix, n, k) of layer 0 is timed (types do not
matter to cuBLAS: the weights are bf16 here). Timing: CUDA events around `reps` launches after a
warm-up, median of `--repetitions` such runs, TFLOP/s = 2 m n k / time.
Usage: cublas_bf16.py --minfer build/minfer [--presets qwen2.5-7b,qwen2.5-14b] [--m 512,4096]
Needs torch with CUDA (the GPU machine has it).
"""
import argparse
import statistics
import subprocess

import torch


def layer_gemms(minfer, preset):
    """(matrix, n, k) of blk.0's weight matrices, in file order."""
    # --tokenizer builtin: the qwen presets' default tokenizer comes from tools/npm, which the GPU
    # machine (no package registry) does not have
    out = subprocess.run([minfer, "synth", "--preset", preset, "--ftype", "q4_k_m", "--tokenizer", "builtin", "--dry-run"],
                         check=True, capture_output=True, text=True).stdout
    gemms = []
    for line in out.splitlines():
        cols = line.split()
        if len(cols) < 5 or not cols[0].startswith("blk.0.") or not cols[0].endswith(".weight"):
            continue
        if cols[3] != "x":  # 1-D tensors: "name type n bytes"
            continue
        k, n = int(cols[2]), int(cols[4])  # GGUF order: row length first
        gemms.append((cols[0][len("blk.0."):-len(".weight")], n, k))
    return gemms


def time_gemm(m, n, k, reps, repetitions):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    torch.matmul(a, w)
    torch.cuda.synchronize()
    times = []
    for _ in range(repetitions):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            torch.matmul(a, w)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / reps * 1e-3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minfer", required=True)
    ap.add_argument("--presets", default="qwen2.5-7b,qwen2.5-14b")
    ap.add_argument("--m", default="512,4096")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--repetitions", type=int, default=5)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    print(f"| preset | matrix | n | k | m | µs (median of {args.repetitions}) | TFLOP/s |")
    print("|---|---|---|---|---|---|---|")
    for preset in args.presets.split(","):
        for matrix, n, k in layer_gemms(args.minfer, preset):
            for m in (int(v) for v in args.m.split(",")):
                t = time_gemm(m, n, k, args.reps, args.repetitions)
                print(f"| {preset} | {matrix} | {n} | {k} | {m} | {t * 1e6:.1f} | {2 * m * n * k / t * 1e-12:.0f} |")


if __name__ == "__main__":
    main()
