"""`convsts train`: multitask training on Ray Train (TorchTrainer, Train V2).

  convsts train --config configs/dan_multitask.yaml --out DIR [dotted.overrides=...]

Data flows one way: prepared parquet shards -> Ray Data (tokenized in map_batches) -> one
stream per task group (TaskSplitDataConfig) -> shared encoder + heads -> losses -> combined
gradients (task_groups) -> checkpoints and MLflow. The final checkpoint is copied to DIR/checkpoint.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch

from datasets import storage
from datasets.snli import fraction_rank
from datasets.text import DanTokenizer, SubwordTokenizer, encode_columns, tokenizer_from_dict, words
from models.checkpoint import build_model, load_model, load_train_state, save_checkpoint
from models.losses import in_batch_accuracy, in_batch_softmax_loss, nli_loss
from ray_jobs import tracking
from ray_jobs.config import RunConfig, flatten, from_dict, load_config, resolve_path
from ray_jobs.runtime import ensure_ray, log, setup_logging, tracking_uri
from ray_jobs.task_groups import GradientCombiner, TaskPlan, draw_task, mark_sparse, plan_tasks, split_params

TASK_COLUMNS = {
    "reddit": {"context": "context", "response": "response"},
    "snli": {"premise": "premise", "hypothesis": "hypothesis"},
}


# ---------------------------------------------------------------------------------------------
# Driver side: tokenizer and datasets


def prepared_paths(prepared_dir: str | Path, tasks: Sequence[str] = ("reddit", "snli")) -> Dict[str, str]:
    """{task: its train shards} in a prepared folder (local or a URI); missing ones raise."""
    paths = {task: storage.join(prepared_dir, task, "train") for task in tasks}
    for task, path in paths.items():
        if not storage.is_dir(path):
            raise FileNotFoundError(f"{task} shards not found at {path}; run `convsts prepare all --out {prepared_dir}` first")
    return paths


def read_shards(path: str, **kwargs):
    """ray.data.read_parquet for a local folder or a URI (endpoint options in its query honoured)."""
    import ray.data

    inner, fs = storage.path_and_filesystem(path)
    return ray.data.read_parquet(inner, filesystem=fs, **kwargs)


def _count_batch(batch: Dict[str, np.ndarray], columns: Sequence[str], lowercase: bool) -> Dict[str, np.ndarray]:
    counts: Counter = Counter()
    for column in columns:
        for text in batch[column]:
            counts.update(words(str(text), lowercase))
    return {"word": np.array(list(counts.keys()), dtype=object), "count": np.array(list(counts.values()))}


def build_tokenizer(cfg: RunConfig, prepared_dir: str | Path):
    """A tokenizer from the training text (Reddit train + the SNLI subset used), counted in Ray Data."""
    # SNLI text is always counted: a Reddit-only run's tokenizer is reused by the multitask runs
    # warm-started from it. Reddit text only when Reddit is trained on (InferSent is SNLI alone).
    tasks = ["snli"] + (["reddit"] if "reddit" in cfg.trainer.task_weights else [])
    paths = prepared_paths(prepared_dir, tasks)
    sources = [(snli_frame(paths["snli"], cfg.data.snli_fraction, cfg.data.snli_fraction_seed), ["premise", "hypothesis"])]
    if "reddit" in paths:
        sources.insert(0, (read_shards(paths["reddit"]), ["context", "response"]))
    if cfg.model.encoder == "transformer":
        def texts():
            for ds, cols in sources:
                for batch in ds.iter_batches(batch_size=4096, batch_format="numpy"):
                    for col in cols:
                        yield from (str(t) for t in batch[col])

        return SubwordTokenizer.train(texts(), cfg.tokenizer)
    total: Counter = Counter()
    for ds, cols in sources:
        partial = ds.map_batches(_count_batch, fn_args=(cols, cfg.tokenizer.lowercase), batch_size=4096)
        for batch in partial.iter_batches(batch_size=None, batch_format="numpy"):
            total.update(dict(zip(batch["word"].tolist(), batch["count"].tolist())))
    return DanTokenizer.build(total, cfg.tokenizer)


def _fraction_filter(batch: Dict[str, np.ndarray], fraction: float, seed: int) -> Dict[str, np.ndarray]:
    keep = np.array([fraction_rank(str(p), str(h), seed) < fraction
                     for p, h in zip(batch["premise"], batch["hypothesis"])], dtype=bool)
    return {name: np.asarray(values)[keep] for name, values in batch.items()}


def snli_frame(path: str, fraction: float, seed: int):
    """SNLI train shards, cut to the nested subset `fraction` drawn with `seed` (datasets.snli.fraction_rank)."""
    ds = read_shards(path)
    if fraction >= 1.0:
        return ds
    return ds.map_batches(_fraction_filter, fn_args=(float(fraction), int(seed)), batch_size=4096)


def _tokenize_batch(batch: Dict[str, np.ndarray], tokenizer_data: Dict[str, Any], columns: Dict[str, str],
                    width: int, passthrough: Sequence[str]) -> Dict[str, np.ndarray]:
    tokenizer = tokenizer_from_dict(tokenizer_data)
    out = encode_columns(tokenizer, batch, columns, width)
    for name in passthrough:
        out[name] = np.asarray(batch[name])
    return out


def frame_batch(tokenizer, part, task: str, width: int) -> Dict[str, torch.Tensor]:
    """One task's batch from rows of a pandas frame, tokenized as the Ray Data pipeline does: what
    single-process loops (bench/) feed to task_loss."""
    columns = TASK_COLUMNS[task]
    ids = encode_columns(tokenizer, {c: part[c].to_numpy() for c in columns}, columns, width)
    batch = {k: torch.from_numpy(v) for k, v in ids.items()}
    if task == "snli":
        batch["label"] = torch.tensor(part["label"].to_numpy())
    return batch


def task_datasets(cfg: RunConfig, prepared_dir: str | Path, tokenizer) -> Dict[str, Any]:
    """{"reddit": Dataset, "snli": Dataset} of token-id columns, only for tasks with a weight."""
    paths = prepared_paths(prepared_dir, list(cfg.trainer.task_weights))
    data = tokenizer.to_dict()
    width = cfg.tokenizer.max_words
    out = {}
    if "reddit" in cfg.trainer.task_weights:
        out["reddit"] = (
            read_shards(paths["reddit"], shuffle="files")
            .map_batches(_tokenize_batch, fn_args=(data, TASK_COLUMNS["reddit"], width, ()), batch_size=1024)
        )
    if "snli" in cfg.trainer.task_weights:
        # Small: tokenize once and keep in the object store.
        out["snli"] = (
            snli_frame(paths["snli"], cfg.data.snli_fraction, cfg.data.snli_fraction_seed)
            .map_batches(_tokenize_batch, fn_args=(data, TASK_COLUMNS["snli"], width, ("label",)), batch_size=1024)
            .materialize()
        )
    return out


def task_split_data_config(plan: TaskPlan):
    """A DataConfig that splits each task's dataset over that task's ranks only; other ranks get None."""
    from ray.train import DataConfig

    class TaskSplitDataConfig(DataConfig):
        def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
            output: List[Dict[str, Any]] = [{} for _ in range(world_size)]
            for name, ds in datasets.items():
                if ds.name is None:
                    ds.set_name(name)
                ds = ds.copy(ds)
                ds.context.execution_options = self._resolve_execution_options(name)
                ranks = plan.ranks_of(name)
                hints = [worker_node_ids[r] for r in ranks] if worker_node_ids else None
                for r in range(world_size):
                    output[r][name] = None
                for r, split in zip(ranks, ds.streaming_split(len(ranks), equal=True, locality_hints=hints)):
                    output[r][name] = split
            return output

    return TaskSplitDataConfig()


# ---------------------------------------------------------------------------------------------
# Worker side


def stage_at(cfg: RunConfig, step: int):
    current = cfg.trainer.stages[0]
    for stage in cfg.trainer.stages:
        if stage.start_step <= step:
            current = stage
    return current


class TaskStream:
    """Endless batches of one task's shard, epoch after epoch; remembers its position for resume."""

    def __init__(self, task: str, shard, batch_size: int, device, seed: int, epoch: int = 0, skip: int = 0):
        self.task, self.shard, self.batch_size, self.device, self.seed = task, shard, batch_size, device, seed
        self.epoch, self.batch_in_epoch = epoch, 0
        self._it = self._batches(skip)

    def _batches(self, skip: int) -> Iterator[Dict[str, torch.Tensor]]:
        while True:
            produced = 0
            for batch in self.shard.iter_torch_batches(
                batch_size=self.batch_size, drop_last=True, device=self.device,
                local_shuffle_buffer_size=4 * self.batch_size, local_shuffle_seed=self.seed + self.epoch,
            ):
                produced += 1
                if skip > 0:
                    skip -= 1
                    self.batch_in_epoch += 1
                    continue
                self.batch_in_epoch += 1
                yield batch
            if produced == 0:
                raise RuntimeError(f"{self.task}: this worker's shard has fewer rows than one batch ({self.batch_size})")
            self.epoch += 1
            self.batch_in_epoch = 0

    def __next__(self) -> Dict[str, torch.Tensor]:
        return next(self._it)

    def position(self) -> Dict[str, int]:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "batch_size": self.batch_size}


def _fields(batch: Dict[str, torch.Tensor], prefix: str) -> Dict[str, torch.Tensor]:
    head = prefix + "__"
    return {k[len(head):]: v for k, v in batch.items() if k.startswith(head)}


def task_loss(model, task: str, batch: Dict[str, torch.Tensor]):
    """(loss, accuracy) of one task's batch."""
    if task == "reddit":
        context, response = model.reddit_embeddings(_fields(batch, "context"), _fields(batch, "response"))
        return in_batch_softmax_loss(context, response), in_batch_accuracy(context, response)
    logits = model.nli_logits(_fields(batch, "premise"), _fields(batch, "hypothesis"))
    labels = batch["label"].long()
    return nli_loss(logits, labels), (logits.argmax(1) == labels).float().mean()


def make_optimizer(cfg: RunConfig, params: List[torch.nn.Parameter], lr: float) -> List[torch.optim.Optimizer]:
    """Sparse embedding tables at the stage's lr; dense parameters at lr x trainer.dense_lr_scale
    (each param group carries its "lr_scale", which set_lr keeps at stage changes)."""
    sparse = [p for p in params if getattr(p, "_convsts_sparse", False)]
    dense = [p for p in params if not getattr(p, "_convsts_sparse", False)]
    scale = cfg.trainer.dense_lr_scale
    groups = [g for g in ({"params": sparse, "lr": lr, "lr_scale": 1.0},
                          {"params": dense, "lr": lr * scale, "lr_scale": scale}) if g["params"]]
    kind = cfg.trainer.optimizer
    if kind == "sgd":
        return [torch.optim.SGD(groups, lr=lr, momentum=cfg.trainer.momentum)]
    if kind == "adagrad":
        return [torch.optim.Adagrad(groups, lr=lr)]
    opts: List[torch.optim.Optimizer] = []
    for group in groups:  # Adam cannot take sparse gradients: SparseAdam for the tables
        opt_class = torch.optim.SparseAdam if group["params"] is sparse else torch.optim.Adam
        opts.append(opt_class([group], lr=group["lr"]))
    return opts


def set_lr(optimizers: Sequence[torch.optim.Optimizer], lr: float) -> None:
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)


def _stsb_dev(cfg: RunConfig):
    from datasets.evalsets import read_stsb, stsb_split_path

    return read_stsb(stsb_split_path(resolve_path(cfg.data.stsb_dir), "dev"))


def sts_dev_pearson(model, tokenizer, frame) -> float:
    from ray_jobs.metrics import angular_similarity, pearson

    model.eval()
    with torch.no_grad():
        def enc(texts):
            out = []
            for i in range(0, len(texts), 512):
                ids = {k: torch.from_numpy(v) for k, v in tokenizer.encode(texts[i:i + 512]).items()}
                out.append(model.encode(ids).cpu().numpy())
            return np.concatenate(out)
        u, v = enc(list(frame["sentence1"])), enc(list(frame["sentence2"]))
    model.train()
    return pearson(angular_similarity(u, v), frame["score"].to_numpy())


def _fmt_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s"


def train_loop_per_worker(loop_config: Dict[str, Any]) -> None:
    """One Ray Train worker. A pure function of `loop_config` (resolved run config, tokenizer,
    MLflow run, initial checkpoint); resumes from `ray.train.get_checkpoint()` after a failure."""
    import ray.train
    import ray.train.torch

    cfg = from_dict(loop_config["run"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    plan = plan_tasks(cfg.trainer.task_weights, world)
    device = ray.train.torch.get_device()
    torch.manual_seed(cfg.trainer.seed)  # identical initial weights on every rank
    tokenizer = tokenizer_from_dict(loop_config["tokenizer"])
    model = build_model(cfg.model, tokenizer)

    state: Optional[Dict[str, Any]] = None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as ckpt_dir:
            model.load_state_dict(load_model(ckpt_dir)[0].state_dict())
            state = load_train_state(ckpt_dir)
    elif loop_config.get("resume_from"):
        model.load_state_dict(load_model(loop_config["resume_from"])[0].state_dict())
        state = load_train_state(loop_config["resume_from"])
    elif loop_config.get("warm_start"):
        warm, _, _ = load_model(loop_config["warm_start"])
        model.encoder.load_state_dict(warm.encoder.state_dict())
        model.heads["reddit"].load_state_dict(warm.heads["reddit"].state_dict())
    model.to(device)
    model.train()

    encoder_params, head_params = split_params(model)
    if cfg.model.encoder == "dan" and cfg.model.dan.sparse_embeddings:
        mark_sparse([model.encoder.word_embedding.weight, model.encoder.bigram_embedding.weight])
    combiner = GradientCombiner(plan, rank)
    my_tasks = plan.tasks_of(rank)
    start = state["step"] if state else 0
    stage = stage_at(cfg, start)
    encoder_opts = make_optimizer(cfg, encoder_params, stage.lr)
    head_opts = {t: make_optimizer(cfg, head_params[t], stage.lr) for t in my_tasks}
    if state:
        for opt, sd in zip(encoder_opts, state["encoder_optimizers"]):
            opt.load_state_dict(sd)
        for t in my_tasks:
            for opt, sd in zip(head_opts[t], state["head_optimizers"].get(t, [])):
                opt.load_state_dict(sd)
        set_lr(encoder_opts + [o for t in my_tasks for o in head_opts[t]], stage.lr)

    # Every rank asks for every dataset: the splits are built when rank 0 asks (Train V2).
    shards = {name: ray.train.get_dataset_shard(name) for name in loop_config["datasets"]}
    positions = (state or {}).get("positions", [])
    my_pos = positions[rank] if len(positions) == world else {}

    def open_streams(batch_size: int, resume: Dict[str, Dict[str, int]]) -> Dict[str, TaskStream]:
        streams = {}
        for t in my_tasks:
            pos = resume.get(t, {})
            skip = pos.get("batch_in_epoch", 0) if pos.get("batch_size") == batch_size else 0
            streams[t] = TaskStream(t, shards[t], batch_size, device, cfg.trainer.seed * 1000 + rank,
                                    epoch=pos.get("epoch", 0), skip=skip)
        return streams

    streams = open_streams(stage.batch_size, my_pos)
    leaders = {t: plan.leader(t) for t in plan.tasks}
    uri, run_id = loop_config.get("tracking_uri"), loop_config.get("run_id")
    if rank == 0:
        print(f"[convsts] {plan.describe()}; world size {world}; device {device}; start step {start}", flush=True)
        if uri and run_id and start == 0:
            tracking.set_tags(uri, run_id, {"task_split_mode": plan.mode})
        if uri and run_id and checkpoint is not None:  # a restarted worker group (FailureConfig)
            tracking.log_metrics(uri, run_id, {"train/restarted_at_step": start}, step=start)
    sts_frame = _stsb_dev(cfg) if (rank == 0 and cfg.trainer.eval_every) else None
    task_gen = torch.Generator().manual_seed(cfg.trainer.seed + start)
    window = {t: {"loss": 0.0, "acc": 0.0, "n": 0, "pairs": 0} for t in plan.tasks}
    window_start = time.time()
    run_start = time.time()
    step = start
    total = cfg.trainer.steps

    def save(step_done: int, metrics: Dict[str, float]) -> None:
        combiner.sync_heads(model.heads)
        gathered = combiner.gather_objects(
            {"heads": {t: [o.state_dict() for o in head_opts[t]] for t in my_tasks if leaders[t] == rank},
             "position": {t: s.position() for t, s in streams.items()}}
        )
        if rank == 0:
            head_states: Dict[str, Any] = {}
            for g in gathered:
                head_states.update(g["heads"])
            train_state = {
                "step": step_done,
                "encoder_optimizers": [o.state_dict() for o in encoder_opts],
                "head_optimizers": head_states,
                "positions": [g["position"] for g in gathered],
                "world_size": world,
                "mode": plan.mode,
            }
            with tempfile.TemporaryDirectory() as tmp:
                unwrapped = model.to("cpu")
                save_checkpoint(tmp, unwrapped, tokenizer, loop_config["run"], train_state)
                model.to(device)
                ray.train.report({**metrics, "step": step_done},
                                 checkpoint=ray.train.Checkpoint.from_directory(tmp))
        else:
            ray.train.report({**metrics, "step": step_done}, checkpoint=None)

    if step >= total:
        save(step, {})
        return
    while step < total:
        new_stage = stage_at(cfg, step)
        if new_stage is not stage:
            stage = new_stage
            set_lr(encoder_opts + [o for t in my_tasks for o in head_opts[t]], stage.lr)
            streams = open_streams(stage.batch_size, {})
        task = draw_task(plan, task_gen) if plan.mode == "task_sampling" else my_tasks[0]
        t0 = time.time()
        batch = next(streams[task])
        for opt in encoder_opts + [o for t in my_tasks for o in head_opts[t]]:
            opt.zero_grad(set_to_none=True)
        loss, acc = task_loss(model, task, batch)
        loss.backward()
        combiner.combine_encoder(encoder_params)
        combiner.combine_head(task, head_params[task])
        if cfg.trainer.grad_clip > 0:
            dense = [p for p in encoder_params + head_params[task] if p.grad is not None and not p.grad.is_sparse]
            torch.nn.utils.clip_grad_norm_(dense, cfg.trainer.grad_clip)
        for opt in encoder_opts + head_opts[task]:
            opt.step()
        step += 1
        w = window[task]
        w["loss"] += float(loss.detach()); w["acc"] += float(acc); w["n"] += 1
        w["pairs"] += stage.batch_size * len(plan.ranks_of(task))
        metrics: Dict[str, float] = {}
        if step % cfg.trainer.log_every == 0 or step == total:
            elapsed = max(time.time() - window_start, 1e-9)
            for t in my_tasks:
                wt = window[t]
                if leaders[t] == rank and wt["n"]:
                    metrics.update({f"{t}/loss": wt["loss"] / wt["n"], f"{t}/batch_accuracy": wt["acc"] / wt["n"],
                                    f"{t}/pairs_per_s": wt["pairs"] / elapsed})
            if rank == 0:
                metrics["step_time_s"] = elapsed / cfg.trainer.log_every
                metrics["lr"] = stage.lr
            if metrics:
                eta = (time.time() - run_start) / (step - start) * (total - step)
                shown = " ".join(f"{k} {v:.4g}" for k, v in metrics.items() if "/" in k)
                print(f"[convsts rank {rank}] step {step}/{total} {shown} eta {_fmt_eta(eta)}", flush=True)
                if uri and run_id:
                    tracking.log_metrics(uri, run_id, metrics, step)
            window = {t: {"loss": 0.0, "acc": 0.0, "n": 0, "pairs": 0} for t in plan.tasks}
            window_start = time.time()
        if sts_frame is not None and step % cfg.trainer.eval_every == 0:
            r = sts_dev_pearson(model, tokenizer, sts_frame)
            print(f"[convsts rank 0] step {step} stsb/dev/pearson {r:.4f}", flush=True)
            if uri and run_id:
                tracking.log_metrics(uri, run_id, {"stsb/dev/pearson_during_training": r}, step)
        if step % cfg.trainer.checkpoint_every == 0 or step == total:
            save(step, {k: v for k, v in metrics.items()})


# ---------------------------------------------------------------------------------------------
# Driver: the TorchTrainer


@dataclass
class TrainResult:
    checkpoint: Path
    run_id: str
    tracking_uri: str
    seconds: float
    mode: str
    snli_train_pairs: Optional[int] = None  # SNLI pairs trained on (after data.snli_fraction), when SNLI is a task


def initial_checkpoint(cfg: RunConfig) -> Optional[str]:
    return cfg.trainer.resume_from or cfg.trainer.warm_start or None


def run_training(cfg: RunConfig, out_dir: str | Path, run_id: Optional[str] = None,
                 prepared_dir: Optional[str | Path] = None, extra_callbacks: Sequence[Any] = ()) -> TrainResult:
    """Build datasets and the TorchTrainer, fit, copy the final checkpoint to out_dir/checkpoint."""
    import ray.train
    from ray.train.torch import TorchTrainer

    started = time.time()
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    prepared = prepared_location(cfg, out_dir, prepared_dir)
    if cfg.trainer.eval_every:
        _stsb_dev(cfg)  # fail here, naming the folder, rather than inside a worker
    ensure_ray()
    uri = tracking_uri(cfg.mlflow.tracking_uri, out_dir)
    params = flatten(cfg.to_dict())
    own_run = run_id is None  # a run we start we also end; a caller's run (demo, tune) is theirs to end
    if own_run:
        run_id = tracking.start_run(uri, cfg.mlflow.experiment, cfg.mlflow.run_name or cfg.name, params,
                                    tags={"convsts.job": "train"})
    else:
        tracking.log_params(uri, run_id, params)

    init = initial_checkpoint(cfg)
    if init:
        _, tokenizer, _ = load_model(init)
        log.info("tokenizer and initial weights from %s", init)
    else:
        tokenizer = build_tokenizer(cfg, prepared)
    log.info("tokenizer: %s, %d ids", type(tokenizer).__name__, tokenizer.num_words)
    datasets = task_datasets(cfg, prepared, tokenizer)
    snli_pairs = datasets["snli"].count() if "snli" in datasets else None  # materialized: counting is free
    if snli_pairs is not None:  # the SNLI-fraction sweep plots against it
        tracking.log_metrics(uri, run_id, {"data/snli_train_pairs": snli_pairs})
    plan = plan_tasks(cfg.trainer.task_weights, cfg.trainer.num_workers)
    log.info("%s", plan.describe())
    loop_config = {
        "run": cfg.to_dict(),
        "tokenizer": tokenizer.to_dict(),
        "datasets": sorted(datasets),
        "tracking_uri": uri,
        "run_id": run_id,
        "resume_from": cfg.trainer.resume_from,
        "warm_start": cfg.trainer.warm_start,
    }
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config,
        scaling_config=ray.train.ScalingConfig(
            num_workers=cfg.trainer.num_workers,
            use_gpu=cfg.trainer.use_gpu,
            resources_per_worker={"CPU": cfg.trainer.cpus_per_worker},
        ),
        datasets=datasets,
        dataset_config=task_split_data_config(plan),
        run_config=ray.train.RunConfig(
            name=cfg.name,
            storage_path=cfg.trainer.storage_path or str(out_dir / "ray_results"),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.trainer.keep_checkpoints),
            failure_config=ray.train.FailureConfig(max_failures=cfg.trainer.max_failures),
            callbacks=list(extra_callbacks) or None,
        ),
    )
    try:
        result = trainer.fit()
    except Exception:
        tracking.end_run(uri, run_id, "FAILED")
        raise
    if result.checkpoint is None:
        tracking.end_run(uri, run_id, "FAILED")
        raise RuntimeError(f"training finished without a checkpoint; see {out_dir / 'ray_results'}")
    final = out_dir / "checkpoint"
    if final.exists():
        shutil.rmtree(final)
    result.checkpoint.to_directory(str(final))
    seconds = time.time() - started
    tracking.log_metrics(uri, run_id, {"train/seconds": seconds}, cfg.trainer.steps)
    tracking.log_artifacts(uri, run_id, str(final), "checkpoint")
    (out_dir / "train.json").write_text(json.dumps(
        {"checkpoint": str(final), "mlflow_run_id": run_id, "tracking_uri": uri, "seconds": round(seconds, 1),
         "task_split_mode": plan.mode}, indent=2), encoding="utf-8")
    if own_run:
        tracking.end_run(uri, run_id)
    return TrainResult(final, run_id, uri, seconds, plan.mode, snli_pairs)


def prepared_location(cfg: RunConfig, out_dir: str | Path, given: Optional[str | Path] = None) -> str:
    """Prepared shards: `given` (--prepared), else data.prepared_dir, else <out>/prepared; local or a URI."""
    location = str(given or resolve_path(cfg.data.prepared_dir) or Path(out_dir) / "prepared")
    return location if storage.is_uri(location) else str(Path(location).resolve())


def ensure_prepared(cfg: RunConfig, prepared: str | Path) -> None:
    """Prepare the shards of the tasks this run trains on that are not in `prepared` yet (SNLI
    always: the tokenizer counts it). `prepared` may be a URI."""
    from ray_jobs.prepare import prepare_reddit, prepare_snli

    ensure_ray()
    if "reddit" in cfg.trainer.task_weights and not storage.is_dir(storage.join(prepared, "reddit", "train")):
        prepare_reddit(cfg.data.reddit_inputs, storage.join(prepared, "reddit"), cfg, cfg.data.reddit_format)
    if not storage.is_dir(storage.join(prepared, "snli", "train")):
        prepare_snli(cfg.data.snli_train, storage.join(prepared, "snli"), cfg)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="convsts train", description=__doc__,
                                               formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None, help="run config YAML")
    parser.add_argument("--out", required=True, help="output folder (checkpoint, ray_results, mlflow.db)")
    parser.add_argument("--prepared", default=None, help="prepared shards (default: data.prepared_dir or OUT/prepared)")
    parser.add_argument("--resume", default=None, help="checkpoint folder to resume from")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.steps=500")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    overrides = list(args.overrides) + ([f"trainer.resume_from={args.resume}"] if args.resume else [])
    cfg = load_config(args.config, overrides)
    prepared = prepared_location(cfg, args.out, args.prepared)
    ensure_prepared(cfg, prepared)
    result = run_training(cfg, args.out, prepared_dir=prepared)
    print(json.dumps({"checkpoint": str(result.checkpoint), "mlflow_run_id": result.run_id,
                      "seconds": round(result.seconds, 1), "task_split_mode": result.mode}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
