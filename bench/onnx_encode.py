"""Encode throughput through torch (`convsts.models.sentence_encoder.load(C).encode`) and through onnxruntime (the graph
`convsts export --format onnx` writes, run by `convsts.models.export.OnnxEncoder`), on the same sentences
in one run: sentences/s of each, their ratio, and the largest difference between the embeddings.

  .venv/bin/python bench/onnx_encode.py [--encoders dan transformer pretrained] [--batch 128] [--sentences 4000]

Each encoder is built at the config defaults (the paper's sizes; untrained weights time the same as
trained ones) with its own tokenizer fit on the embedded Reddit sample, saved as a checkpoint and
exported. Both paths tokenize in Python, sort by length and batch alike; the timings include
tokenization. Best of 3 passes over the sentences for each path (a shared VM's speed drifts).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def best_rate(encode, sentences, batch_size: int, passes: int = 3) -> float:
    encode(sentences[:64], batch_size=batch_size)  # warm-up
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        encode(sentences, batch_size=batch_size)
        best = min(best, time.perf_counter() - start)
    return len(sentences) / best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoders", nargs="+", default=["dan", "transformer"])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--sentences", type=int, default=4000)
    args = parser.parse_args()

    import numpy as np
    import onnxruntime
    import torch

    from convsts.datasets.config import TokenizerConfig
    from convsts.datasets.reddit import read_pairs_file
    from convsts.datasets.text import fit_tokenizer
    from convsts.io.storage import resolve_path
    from convsts.models.checkpoint import build_model, save_checkpoint
    from convsts.models.config import ModelConfig
    from convsts.models.encoders import encoder_class
    from convsts.models.export import OnnxEncoder, to_onnx
    from convsts.models.sentence_encoder import load

    pairs = read_pairs_file(resolve_path("{sample}/reddit_pairs.parquet"))
    texts = [t for t in list(pairs["context"]) + list(pairs["response"]) if isinstance(t, str)]
    sentences = (texts * (1 + args.sentences // len(texts)))[: args.sentences]
    print(
        f"CPU, {os.cpu_count()} cores; torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"onnxruntime {onnxruntime.__version__}; {len(sentences)} Reddit sample sentences, batch {args.batch}"
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.encoders:
            config = ModelConfig(encoder=name)
            tokenizer = fit_tokenizer(encoder_class(name).tokenizer_kind, texts, TokenizerConfig(), config)
            torch.manual_seed(0)
            ckpt = save_checkpoint(Path(tmp) / name, build_model(config, tokenizer), tokenizer, {})
            exported = to_onnx(ckpt, Path(tmp) / f"{name}.onnx")
            # torch is timed before any onnxruntime session exists: onnxruntime's idle threads spin
            # for a while after each run and, on a machine with few cores, slow whatever runs beside.
            torch_encoder = load(ckpt)
            torch_rate = best_rate(torch_encoder.encode, sentences, args.batch)
            onnx_encoder = OnnxEncoder(exported)
            onnx_rate = best_rate(onnx_encoder.encode, sentences, args.batch)
            diff = float(
                np.abs(
                    torch_encoder.encode(sentences[:500], batch_size=args.batch)
                    - onnx_encoder.encode(sentences[:500], batch_size=args.batch)
                ).max()
            )
            onnx_encoder = None  # its session (and threads) released before the next encoder is timed
            rows.append(
                {
                    "encoder": name,
                    "torch_sentences_per_s": torch_rate,
                    "onnx_sentences_per_s": onnx_rate,
                    "onnx_over_torch": onnx_rate / torch_rate,
                    "max_abs_diff": diff,
                }
            )
            print(
                f"  {name:<12} torch {torch_rate:9.0f} sentences/s   onnxruntime {onnx_rate:9.0f} sentences/s   "
                f"ratio {onnx_rate / torch_rate:5.2f}   max |diff| {diff:.1e}"
            )
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
