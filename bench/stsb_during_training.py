"""STS-B dev Pearson of the shared encoder while it trains, in one process (no Ray): the probe
behind the residual response head and `trainer.dense_lr_scale` (docs/design.md).

  .venv/bin/python bench/stsb_during_training.py --prepared DIR/prepared --tokenizer CKPT/tokenizer.json \\
      --weights reddit=0.95,snli=0.05 --steps 1250 [dotted.overrides ...]

Each step sums the tasks' weighted losses on one batch each (batch 128 from the prepared train
shards, shuffled with seed 0), with the optimizer and learning rates of the run config
(`--config`, overrides such as trainer.dense_lr_scale=0.1 or trainer.stages=[...]); every
`--every` steps it prints STS-B dev Pearson of the encoder and the mean step time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prepared", required=True)
    parser.add_argument("--tokenizer", required=True, help="a tokenizer.json (e.g. from a checkpoint of the same data)")
    parser.add_argument("--config", default="configs/dan_multitask.yaml")
    parser.add_argument("--weights", default="reddit=0.95,snli=0.05")
    parser.add_argument("--steps", type=int, default=1250)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    import pyarrow.parquet as pq
    import torch

    from datasets.evalsets import read_stsb, stsb_split_path
    from datasets.text import load_tokenizer
    from models.checkpoint import build_model
    from ray_jobs.config import load_config, resolve_path
    from ray_jobs.task_groups import mark_sparse
    from ray_jobs.train import frame_batch, make_optimizer, sts_dev_pearson, task_loss

    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, args.overrides)
    weights = {task: float(w) for task, w in (item.split("=") for item in args.weights.split(","))}
    tokenizer = load_tokenizer(args.tokenizer)
    dev = read_stsb(stsb_split_path(resolve_path(cfg.data.stsb_dir), "dev"))
    frames = {task: pq.read_table(str(Path(args.prepared) / task / "train")).to_pandas().sample(frac=1.0, random_state=0)
              for task in weights}
    batch_size = cfg.trainer.stages[0].batch_size

    def batches(task):
        frame, start = frames[task], 0
        while True:
            if start + batch_size > len(frame):
                start = 0
            part = frame.iloc[start:start + batch_size]
            start += batch_size
            yield frame_batch(tokenizer, part, task, cfg.tokenizer.max_words)

    torch.manual_seed(cfg.trainer.seed)
    model = build_model(cfg.model, tokenizer)
    mark_sparse([model.encoder.word_embedding.weight, model.encoder.bigram_embedding.weight])
    opts = make_optimizer(cfg, list(model.parameters()), cfg.trainer.stages[0].lr)
    streams = {task: batches(task) for task in weights}
    print(f"{weights} step 0 stsb/dev/pearson {sts_dev_pearson(model, tokenizer, dev):.4f}", flush=True)
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        loss = sum(w * task_loss(model, task, next(streams[task]))[0] for task, w in weights.items())
        loss.backward()
        for opt in opts:
            opt.step()
        if step % args.every == 0:
            print(f"{weights} step {step} stsb/dev/pearson {sts_dev_pearson(model, tokenizer, dev):.4f} "
                  f"{(time.perf_counter() - started) / step:.3f} s/step", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
