"""Encoders at the paper's sizes, trained for a fixed number of steps in one process (no Ray):
pairs/s, peak memory, the FLOP rate achieved, and this machine's dense matmul rate in the same run.

  .venv/bin/python bench/encoders.py [--encoders dan transformer bilstm] [--batch 128] [--device cpu|cuda]

The step is the Reddit input-response step of the multitask model (context and response through
the shared encoder, the response-side network, in-batch softmax, backward, optimizer step) on
real Reddit pairs from the embedded sample. FLOPs are counted by torch's FlopCounterMode on one
step (matmuls, attention, LSTM cells; embedding-table lookups and sparse updates do no FLOPs in
that count, so the share of peak says how much of the step is dense math). Each encoder runs in
its own process so that peak memory is its own. On a GPU it also runs in bf16 autocast.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STEPS = {"dan": 60, "transformer": 8, "bilstm": 4}


def matmul_rate(device: str, dtype, n: int = 2048, repeats: int = 10) -> float:
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times)


def run_encoder(encoder: str, batch: int, device: str, bf16: bool, queue) -> None:
    import pyarrow.parquet as pq
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from datasets.text import DanTokenizer, TokenizerConfig, count_words
    from models.checkpoint import build_model
    from models.config import ModelConfig
    from ray_jobs.config import resolve_path
    from ray_jobs.task_groups import mark_sparse
    from ray_jobs.train import task_loss

    pairs = pq.read_table(resolve_path("{sample}/reddit_pairs.parquet")).to_pandas()
    ctx_col, rsp_col = pairs.columns[:2] if "context" not in pairs.columns else ("context", "response")
    texts_c, texts_r = list(pairs[ctx_col].astype(str)), list(pairs[rsp_col].astype(str))
    tokenizer = DanTokenizer.build(count_words(texts_c + texts_r), TokenizerConfig(word_vocab_size=50000,
                                                                                   bigram_buckets=100000))
    torch.manual_seed(0)
    model = build_model(ModelConfig(encoder=encoder), tokenizer).to(device)
    sparse = []
    if encoder == "dan":
        sparse = [model.encoder.word_embedding.weight, model.encoder.bigram_embedding.weight]
        mark_sparse(sparse)
    dense = [p for p in model.parameters() if all(p is not s for s in sparse)]
    opts = [torch.optim.Adam(dense, lr=1e-3)] + ([torch.optim.SparseAdam(sparse, lr=1e-3)] if sparse else [])

    def batch_at(i):
        lo = (i * batch) % (len(texts_c) - batch)
        out = {}
        for prefix, texts in (("context", texts_c), ("response", texts_r)):
            for k, v in tokenizer.encode(texts[lo:lo + batch], width=64).items():
                out[f"{prefix}__{k}"] = torch.from_numpy(v).to(device)
        return out

    def step(i):
        data = batch_at(i)
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = task_loss(model, "reddit", data)
        loss.backward()
        for opt in opts:
            opt.step()

    step(0)  # warm-up
    counter = FlopCounterMode(display=False)
    with counter:
        step(1)
    flops_per_step = counter.get_total_flops()
    steps = STEPS[encoder] * (10 if device == "cuda" else 1)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for i in range(2, 2 + steps):
        step(i)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated() if device == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    queue.put({"encoder": encoder, "steps": steps, "pairs_per_s": steps * batch / seconds,
               "flops_per_step": flops_per_step, "flop_rate": flops_per_step * steps / seconds,
               "peak_bytes": peak, "params": sum(p.numel() for p in model.parameters())})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoders", nargs="+", default=["dan", "transformer", "bilstm"])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    args = parser.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(0) if device == "cuda" else f"CPU, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    print(f"device: {device} ({name}); torch {torch.__version__}; batch {args.batch} pairs")
    precisions = [("fp32", torch.float32, False)] + ([("bf16", torch.bfloat16, True)] if device == "cuda" else [])
    ctx = mp.get_context("spawn")
    rows = []
    for label, dtype, bf16 in precisions:
        peak = matmul_rate(device, dtype)
        print(f"measured dense {label} matmul (2048^3): {peak / 1e9:.1f} GFLOP/s")
        for encoder in args.encoders:
            queue = ctx.Queue()
            proc = ctx.Process(target=run_encoder, args=(encoder, args.batch, device, bf16, queue))
            proc.start()
            result = queue.get()
            proc.join()
            result.update(precision=label, share_of_peak=result["flop_rate"] / peak)
            rows.append(result)
            print(f"  {encoder:<12} {label}  {result['pairs_per_s']:9.1f} pairs/s   "
                  f"{result['flops_per_step'] / 1e9:8.2f} GFLOP/step   {result['flop_rate'] / 1e9:8.2f} GFLOP/s   "
                  f"{100 * result['share_of_peak']:5.1f}% of matmul   peak mem {result['peak_bytes'] / 2**20:7.0f} MiB   "
                  f"({result['steps']} steps, {result['params'] / 1e6:.1f} M params)")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
