"""The one run config: a dataclass tree, its defaults and the rules its values keep.

Defaults live here and only here; config/loader.py builds a RunConfig from YAML and dotted
command-line overrides (`load_config("configs/demo.yaml", ["trainer.steps=500"])`). The resolved
config is saved with every checkpoint and logged to MLflow.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from convsts.datasets.config import RedditFilterConfig, TokenizerConfig
from convsts.io.errors import ConfigError
from convsts.models.config import ENCODER_NAMES, POOLINGS, ModelConfig, StsTransformConfig


@dataclass
class DataConfig:
    # Raw inputs of `convsts prepare`. "{sample}" expands to the embedded sample folder.
    reddit_inputs: list[str] = field(default_factory=lambda: ["{sample}/reddit_pairs.parquet"])
    reddit_format: str = "auto"  # auto | pushshift | pairs
    snli_train: str = "{sample}/snli_train.parquet"  # SNLI training pairs: jsonl, txt or parquet, plain or compressed
    snli_dev: str = "{sample}/snli_dev.parquet"  # scored as snli/dev/accuracy
    snli_test: str = ""  # scored as snli/test/accuracy; "" = not scored
    stsb_dir: str = "{sample}"  # holds stsb_{train,dev,test}.parquet or the official sts-*.csv
    cqa_test: str = "{sample}/cqa2016_test.parquet"  # parquet, or the official SemEval 2016/2017 XML
    cqa_relevancy: str = ""  # gold .relevancy file for an XML without gold labels (2017 test)
    cqa_name: str = "cqa2016"  # metric prefix: <cqa_name>/map (e.g. cqa2017 for the 2017 test)
    # Where `prepare` writes shards and `train`/`evaluate` read them; "" = <out>/prepared.
    prepared_dir: str = ""
    test_share: float = 0.1  # share of Reddit threads held out (paper: 10%)
    split_salt: str = "convsts"  # salt of the thread hash that splits Reddit (another salt, another held-out set)
    # Nested subset of SNLI train used for training; 0 = none: SNLI is not trained (it leaves
    # trainer.task_weights and trainer.head_lr_scale), the data-quantity curve's origin.
    snli_fraction: float = 1.0
    snli_fraction_seed: int = 0  # seed of the SNLI subset draw (each seed a different nested family)
    rows_per_shard: int = 50_000  # rows per parquet shard `prepare` writes (at least; the last may hold fewer)
    # Inputs of `prepare` up to this many bytes (on disk, all files of a task together) are prepared
    # in the driver process, in memory, without starting Ray; larger ones through Ray Data. The same
    # shards either way; 0 = always Ray Data. (pushshift dumps: dump_local_bytes.)
    driver_bytes: int = 64 * 2**20
    # pushshift comment dumps up to this many bytes (on disk, all files together) are prepared in the
    # driver process by the streaming engine (memory bounded by its chunk and spill partition, which it
    # spills to TMPDIR), without starting Ray; larger ones through Ray Data across the cluster. The
    # same shards either way; 0 = always Ray Data.
    dump_local_bytes: int = 4 * 2**30
    # Reddit: train with the `negative` column that `convsts mine-negatives` adds to the training
    # shards (each context's softmax runs over the batch's responses and its mined negatives).
    reddit_hard_negatives: bool = False
    # Raw inputs of tasks beyond the built-in ones: {task name: [files, folders or globs]}.
    task_inputs: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class StageConfig:
    start_step: int = 0  # the step this stage starts at
    batch_size: int = 128  # pairs per worker and step
    lr: float = 0.01  # the learning rate of embedding tables (dense parameters: x trainer.dense_lr_scale)


OPTIMIZERS = ("sgd", "adagrad", "adam", "adamw")
PRECISIONS = ("fp32", "bf16")
LR_DECAYS = ("none", "linear", "cosine")
TASK_SPLITS = ("sync", "async")
FEEDS = ("ray_data", "local")
RUN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
PLACEMENT_STRATEGIES = ("SPREAD", "PACK", "STRICT_SPREAD", "STRICT_PACK")
MLFLOW_NAME_CHARS = 500  # the longest experiment name MLflow takes
SNLI_TASK = "snli"  # the task that data.snli_fraction cuts (ray_jobs/tasks/snli.py; parsing a config imports no task)
RESUME_LATEST = "latest"  # trainer.resume_from: the newest complete checkpoint of the run --out records


@dataclass
class TrainerConfig:
    steps: int = 1000  # training steps; 0 saves the encoder untrained
    # Ray Train workers, split over the tasks (task_workers): N, or [MIN, MAX] for an elastic group
    # (Ray's own spelling) that starts with what fits, shrinks when nodes are lost and grows when
    # they come back (docs/cluster.md).
    num_workers: Any = 2
    # Elastic groups: how often Ray looks for room to grow the group (Ray's elastic_resize_monitor_interval_s).
    resize_interval_s: float = 60.0
    cpus_per_worker: float = 0.5  # CPUs Ray reserves for each worker (two fit a 1-CPU node)
    # Custom resources each worker asks for besides its CPUs (and GPU), e.g. {trainer_node: 1} to
    # keep the workers on the nodes started with `ray start --resources='{"trainer_node": 8}'` and
    # leave the others' CPUs to the feed's tasks (docs/cluster.md). Ray's resources_per_worker.
    worker_resources: dict[str, float] = field(default_factory=dict)
    # torch's intra-op threads in each worker; 0 = Ray's choice (the floor of cpus_per_worker, at
    # least 1). One worker on a small node can reserve 1 CPU and compute on every core with
    # torch_threads = the node's cores (it reads and tokenizes its batches in a thread beside its steps).
    torch_threads: int = 0
    # How the training rows reach the workers, in each task's one order (docs/design.md):
    # ray_data: one Ray Data pipeline per task reads each block once and tokenizes on any node with
    # CPUs the workers left, and the task's dealer hands each rank its own batches;
    # local: each worker reads and tokenizes its own slices itself (every rank reads the data).
    feed: str = "ray_data"
    # trainer.feed=local: processes each worker reads and tokenizes its batches in, beside its steps;
    # 0 = a thread of the worker. At most the worker's CPUs (trainer.cpus_per_worker).
    feed_processes: int = 0
    # Rows shuffled together in each task's epoch order (MosaicML Streaming's shuffle_block_size):
    # the shards in a seeded order, cut into blocks of about this many rows (whole shards), each
    # block's rows shuffled. A restart reads the one block that holds its next row; larger blocks
    # mix the rows of more shards and cost a restart more reading.
    shuffle_block_rows: int = 131072
    use_gpu: bool = False  # one GPU per worker (NCCL between workers)
    # How Ray places the task workers on a cluster's nodes (Ray's placement-group strategies).
    # SPREAD (default): over distinct nodes where it can, so losing a node loses few workers and the
    # workers do not compete for one node's cores, network and disk; PACK: as few nodes as possible
    # (less traffic between nodes for the gradient exchange); STRICT_*: refuse rather than bend.
    # On one machine both give the same run.
    placement_strategy: str = "SPREAD"
    # Each task's share of the updates (the paper: 95/5), by gradient weighting or by workers per task.
    task_weights: dict[str, float] = field(default_factory=lambda: {"reddit": 0.95, SNLI_TASK: 0.05})
    # Workers per task, e.g. {reddit: 19, snli: 1} (summing to num_workers); {} = by the weights
    # (largest remainder, at least one each).
    task_workers: dict[str, int] = field(default_factory=dict)
    # sync: one update per step from every worker's gradients (all-reduce, docs/design.md);
    # async: each task's workers push their own updates to a parameter holder as they are ready.
    task_split: str = "sync"  # sync | async
    # async: a worker takes fresh weights from the holder with every Nth update it pushes.
    async_refresh_every: int = 1
    # async: a worker computes its next update while the holder applies its last (one update in
    # flight, one more of staleness); pays off when the holder has cores of its own (docs/design.md).
    async_overlap: bool = False
    # async: how many updates a task may run ahead of its weight's share of all updates before
    # its workers wait (the realised mix stays within this of the weights).
    async_slack: int = 8
    # The schedule: from each stage's start_step on, its batch size and lr (the paper: 128 then 256).
    stages: list[StageConfig] = field(
        default_factory=lambda: [
            StageConfig(0, 128, 0.01),
            StageConfig(1_000_000, 256, 0.001),
        ]
    )
    optimizer: str = "sgd"  # sgd | adagrad | adam | adamw (adam/adamw use SparseAdam for sparse tables)
    momentum: float = 0.0  # sgd's momentum
    weight_decay: float = 0.0  # adamw's decoupled weight decay (dense parameters)
    # The lr rises linearly from 0 to the first stage's lr over this many steps; 0 = no warm-up.
    warmup_steps: int = 0
    # After warm-up the lr falls toward 0 at the last step (a factor on each stage's lr): none | linear | cosine.
    lr_decay: str = "none"
    # "bf16": the forward pass and the loss under bfloat16 autocast (weights and optimizer in fp32).
    precision: str = "fp32"  # fp32 | bf16
    # lr of dense parameters (encoder DNN, heads) = stage lr x this; embedding tables get the stage lr.
    dense_lr_scale: float = 1.0
    # Per task, its head's lr = that x this (1 for a task not named): a new classifier on a
    # pretrained encoder learns faster than the encoder under it, e.g. {snli: 50}.
    head_lr_scale: dict[str, float] = field(default_factory=dict)
    grad_clip: float = 0.0  # 0 = off
    # Length bucketing: each worker sorts windows of this many batches by length and trains on them
    # in a shuffled order, so a batch's rows have similar lengths and the Transformer / BiLSTM / the
    # pretrained encoder spend less on padding (each batch is cut to its own longest row); 0 = off.
    bucket_batches: int = 0
    checkpoint_every: int = 500  # steps between checkpoints (Ray Train's, in storage_path)
    keep_checkpoints: int = 2  # checkpoints Ray keeps: the last ones, or the best by STS-B dev with eval_every
    log_every: int = 20  # steps between progress lines and logged metrics
    eval_every: int = 0  # STS-B dev Pearson every N steps inside training; 0 = off
    warm_start: str = ""  # a checkpoint whose shared encoder (and tokenizer) initialise this run
    # a checkpoint to continue from (model, optimizers, step, data position); "latest": the newest
    # complete one of the run that the --out folder records (a run whose driver died)
    resume_from: str = ""
    max_failures: int = 2  # times Ray Train restarts the workers from the last checkpoint after a failure
    # Ray Train's storage (checkpoints, results); "" = <out>/ray_results. A multi-node cluster
    # needs one that every node reaches: a URI (s3://, gs://) or a shared mount.
    storage_path: str = ""

    @property
    def worker_range(self) -> tuple[int, int]:
        """(MIN, MAX) of the task worker group; MIN == MAX for a fixed-size group."""
        n = self.num_workers
        return (n[0], n[1]) if isinstance(n, (list, tuple)) else (n, n)

    @property
    def elastic(self) -> bool:
        low, high = self.worker_range
        return low < high

    @property
    def min_workers(self) -> int:
        return self.worker_range[0]

    @property
    def max_workers(self) -> int:
        return self.worker_range[1]

    def workers_text(self) -> str:
        """trainer.num_workers as a person reads it: "4", or "1-3" for an elastic group."""
        low, high = self.worker_range
        return f"{low}-{high}" if self.elastic else str(high)

    def worker_request(self) -> dict[str, float]:
        """What Ray reserves for each task worker (ScalingConfig's resources_per_worker, with its GPU)."""
        return {"CPU": self.cpus_per_worker, **({"GPU": 1.0} if self.use_gpu else {}), **self.worker_resources}

    def ray_num_workers(self) -> int | tuple[int, int]:
        """ScalingConfig's num_workers: N, or (MIN, MAX) for an elastic group."""
        return self.worker_range if self.elastic else self.max_workers


@dataclass
class EvalConfig:
    reddit_pairs: int = 1000  # held-out pairs scored for P@N
    reddit_negatives: int = 99  # wrong responses beside the true one for each P@N query
    seed: int = 0  # seed of the evaluation samples (the same queries for every model)
    batch_size: int = 512  # texts encoded at once
    # The "tuned" STS variant: one matrix fit on STS-B train, selected on dev (models/sts_transform.py).
    tuned: StsTransformConfig = field(default_factory=StsTransformConfig)


@dataclass
class MlflowConfig:
    tracking_uri: str = ""  # "" = sqlite:///<out>/mlflow.db; MLFLOW_TRACKING_URI wins when set
    experiment: str = "convsts"  # MLflow experiment (created as a model-training experiment)
    run_name: str = ""  # "" = the run config's name
    register_as: str = ""  # also register each training run's model under this name (MLflow model registry)


@dataclass
class RunConfig:
    name: str = "convsts"  # the run's name: its MLflow run name and its folder under trainer.storage_path
    # Seeds everything random in training: initial weights (torch), numpy and Python's random, the
    # shard order of streamed tasks, the local shuffle of batches and the task draws of one worker.
    # Evaluation samples (eval.seed) and the SNLI subset (data.snli_fraction_seed) have their own,
    # so that models trained with different seeds are compared on the same queries and data.
    seed: int = 0
    # Modules defining tasks beyond ray_jobs/tasks/ (each binds a Task to the name TASK).
    task_modules: list[str] = field(default_factory=list)
    data: DataConfig = field(default_factory=DataConfig)
    filters: RedditFilterConfig = field(default_factory=RedditFilterConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)

    def validate(self) -> RunConfig:
        if not RUN_NAME.fullmatch(self.name):  # it names folders: OUT/ray_results/<name>, <storage_path>/<name>
            raise ConfigError(
                f"name: a plain name (letters, digits, '.', '_', '-'; not starting with '.' or '-'), got {self.name!r}"
            )
        if self.model.encoder not in ENCODER_NAMES:
            raise ConfigError(f"model.encoder: expected {'|'.join(ENCODER_NAMES)}, got {self.model.encoder!r}")
        if self.data.reddit_format not in ("auto", "pushshift", "pairs"):
            raise ConfigError(f"data.reddit_format: expected auto|pushshift|pairs, got {self.data.reddit_format!r}")
        if not 0.0 <= self.data.snli_fraction <= 1.0:
            raise ConfigError(f"data.snli_fraction: expected a value in [0, 1], got {self.data.snli_fraction}")
        if self.data.snli_fraction == 0.0:  # no SNLI pair to train on: the run trains the other tasks
            self.trainer.task_weights = {k: w for k, w in self.trainer.task_weights.items() if k != SNLI_TASK}
            self.trainer.head_lr_scale = {k: s for k, s in self.trainer.head_lr_scale.items() if k != SNLI_TASK}
        if not 0.0 <= self.data.test_share < 1.0:
            raise ConfigError(f"data.test_share: expected a value in [0, 1), got {self.data.test_share}")
        if self.trainer.optimizer not in OPTIMIZERS:
            raise ConfigError(f"trainer.optimizer: expected {'|'.join(OPTIMIZERS)}, got {self.trainer.optimizer!r}")
        if not self.trainer.task_weights:
            raise ConfigError(
                "trainer.task_weights: give at least one task, e.g. {reddit: 0.95, snli: 0.05}"
                + (" (data.snli_fraction=0 trains no SNLI)" if self.data.snli_fraction == 0.0 else "")
            )
        if self.tokenizer.bigram_buckets < 2:  # id 0 is padding; hashing needs at least one more
            raise ConfigError(f"tokenizer.bigram_buckets: must be at least 2, got {self.tokenizer.bigram_buckets}")
        _validate_worker_count(self.trainer.num_workers)
        if not self.trainer.stages or self.trainer.stages[0].start_step != 0:
            raise ConfigError("trainer.stages: the first stage must start at step 0")
        starts = [s.start_step for s in self.trainer.stages]
        if starts != sorted(starts):
            raise ConfigError(f"trainer.stages: start_step values must increase, got {starts}")
        self._validate_numbers()
        try:
            self.eval.tuned.validate()
        except ValueError as err:
            raise ConfigError(str(err)) from None
        return self

    def _validate_numbers(self) -> None:
        """Every number a run uses is in its range before Ray starts (one line naming the key)."""
        _validate_trainer_numbers(self.trainer)
        _validate_task_layout(self.trainer)
        _validate_model_numbers(self.model, self.trainer)
        _validate_encoder_sizes(self.model)
        tok = self.tokenizer
        for key in ("word_vocab_size", "max_words", "subword_vocab_size", "min_count"):
            _require(getattr(tok, key) >= 1, f"tokenizer.{key}", ">= 1", getattr(tok, key))
        _require(self.data.rows_per_shard >= 1, "data.rows_per_shard", ">= 1", self.data.rows_per_shard)
        _require(self.data.driver_bytes >= 0, "data.driver_bytes", ">= 0", self.data.driver_bytes)
        _require(self.data.dump_local_bytes >= 0, "data.dump_local_bytes", ">= 0", self.data.dump_local_bytes)
        _require(self.eval.reddit_pairs >= 1, "eval.reddit_pairs", ">= 1", self.eval.reddit_pairs)
        _require(self.eval.reddit_negatives >= 1, "eval.reddit_negatives", ">= 1", self.eval.reddit_negatives)
        _require(self.eval.batch_size >= 1, "eval.batch_size", ">= 1", self.eval.batch_size)
        name = self.mlflow.experiment  # MLflow's own rule, found here rather than after the work
        _require(
            0 < len(name) <= MLFLOW_NAME_CHARS, "mlflow.experiment", f"1 to {MLFLOW_NAME_CHARS} characters", len(name)
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return OmegaConf.to_yaml(OmegaConf.structured(self))


def _require(ok: bool, key: str, rule: str, value) -> None:
    if not ok:
        raise ConfigError(f"config key '{key}': must be {rule}, got {value!r}")


def _finite_positive(key: str, value) -> None:
    _require(isinstance(value, (int, float)) and math.isfinite(value) and value > 0, key, "finite and > 0", value)


def _validate_worker_count(n: Any) -> None:
    """trainer.num_workers: N >= 1, or [MIN, MAX] with 1 <= MIN <= MAX."""
    whole = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    pair = isinstance(n, (list, tuple)) and len(n) == 2 and all(whole(v) for v in n)
    _require(
        (whole(n) and n >= 1) or (pair and 1 <= n[0] <= n[1]),
        "trainer.num_workers",
        "a whole number >= 1, or [MIN, MAX] with 1 <= MIN <= MAX (an elastic group)",
        list(n) if isinstance(n, (list, tuple)) else n,
    )


def _validate_worker_resources(resources: dict[str, float]) -> None:
    """trainer.worker_resources: custom resources only, each finite and > 0."""
    for name, amount in resources.items():
        key = f"trainer.worker_resources.{name}"
        _require(
            name not in ("CPU", "GPU"),
            key,
            "a custom resource (CPUs: trainer.cpus_per_worker; a GPU: trainer.use_gpu)",
            amount,
        )
        _finite_positive(key, amount)


def _validate_trainer_numbers(t: TrainerConfig) -> None:
    _require(t.steps >= 0, "trainer.steps", ">= 0 (0 = save the untrained model)", t.steps)
    _require(t.cpus_per_worker > 0, "trainer.cpus_per_worker", "> 0", t.cpus_per_worker)
    _validate_worker_resources(t.worker_resources)
    _require(t.torch_threads >= 0, "trainer.torch_threads", ">= 0 (0 = Ray's choice)", t.torch_threads)
    _require(t.shuffle_block_rows >= 1, "trainer.shuffle_block_rows", ">= 1", t.shuffle_block_rows)
    _require(t.feed in FEEDS, "trainer.feed", "|".join(FEEDS), t.feed)
    _require(t.feed_processes >= 0, "trainer.feed_processes", ">= 0 (0 = a thread of the worker)", t.feed_processes)
    _require(
        t.feed_processes <= max(1, int(t.cpus_per_worker)),
        "trainer.feed_processes",
        f"at most the worker's CPUs (trainer.cpus_per_worker={t.cpus_per_worker:g})",
        t.feed_processes,
    )
    _require(
        t.feed == "local" or not t.feed_processes,
        "trainer.feed_processes",
        "0 with trainer.feed=ray_data (its pipeline's tasks read and tokenize; feed_processes is the local feed's)",
        t.feed_processes,
    )
    for key in ("checkpoint_every", "log_every", "keep_checkpoints"):
        _require(getattr(t, key) >= 1, f"trainer.{key}", ">= 1", getattr(t, key))
    _require(t.eval_every >= 0, "trainer.eval_every", ">= 0 (0 = off)", t.eval_every)
    _require(t.bucket_batches >= 0, "trainer.bucket_batches", ">= 0 (0 = off)", t.bucket_batches)
    _require(t.max_failures >= 0, "trainer.max_failures", ">= 0", t.max_failures)
    _require(
        isinstance(t.resize_interval_s, (int, float))
        and math.isfinite(t.resize_interval_s)
        and t.resize_interval_s > 0,
        "trainer.resize_interval_s",
        "finite and > 0",
        t.resize_interval_s,
    )
    _require(
        math.isfinite(t.grad_clip) and t.grad_clip >= 0,
        "trainer.grad_clip",
        "finite and >= 0 (0 = off)",
        t.grad_clip,
    )
    _require(math.isfinite(t.momentum) and 0 <= t.momentum < 1, "trainer.momentum", "in [0, 1)", t.momentum)
    _require(
        math.isfinite(t.weight_decay) and t.weight_decay >= 0,
        "trainer.weight_decay",
        "finite and >= 0",
        t.weight_decay,
    )
    _require(t.warmup_steps >= 0, "trainer.warmup_steps", ">= 0 (0 = off)", t.warmup_steps)
    _require(t.precision in PRECISIONS, "trainer.precision", "|".join(PRECISIONS), t.precision)
    _require(t.lr_decay in LR_DECAYS, "trainer.lr_decay", "|".join(LR_DECAYS), t.lr_decay)
    _require(t.task_split in TASK_SPLITS, "trainer.task_split", "|".join(TASK_SPLITS), t.task_split)
    _require(
        t.placement_strategy in PLACEMENT_STRATEGIES,
        "trainer.placement_strategy",
        "|".join(PLACEMENT_STRATEGIES),
        t.placement_strategy,
    )
    _require(t.async_refresh_every >= 1, "trainer.async_refresh_every", ">= 1", t.async_refresh_every)
    _require(t.async_slack >= 0, "trainer.async_slack", ">= 0", t.async_slack)


def _validate_task_layout(t: TrainerConfig) -> None:
    """trainer.task_workers and trainer.task_split=async against the trained tasks."""
    for task, count in t.task_workers.items():
        _require(
            task in t.task_weights,
            f"trainer.task_workers.{task}",
            f"a trained task ({', '.join(t.task_weights)})",
            task,
        )
        _require(count >= 1, f"trainer.task_workers.{task}", ">= 1", count)
    if t.task_workers:
        _require(
            sorted(t.task_workers) == sorted(t.task_weights),
            "trainer.task_workers",
            f"a count for every trained task ({', '.join(t.task_weights)})",
            dict(t.task_workers),
        )
        _require(
            not t.elastic,
            "trainer.task_workers",
            f"{{}} with an elastic trainer.num_workers ({list(t.worker_range)}): the split is planned anew at each size",
            dict(t.task_workers),
        )
        _require(
            sum(t.task_workers.values()) == t.max_workers,
            "trainer.task_workers",
            f"counts summing to trainer.num_workers ({t.max_workers})",
            dict(t.task_workers),
        )
    if t.task_split == "async":
        _require(
            not t.elastic,
            "trainer.num_workers",
            "one number with trainer.task_split=async (its parameter holder paces a fixed set of ranks; "
            "docs/design.md)",
            list(t.worker_range),
        )
        _require(
            t.max_workers >= len(t.task_weights),
            "trainer.num_workers",
            f">= the number of tasks ({len(t.task_weights)}) with trainer.task_split=async",
            t.max_workers,
        )
    else:  # every size the group takes is one rank (drawing each step's task) or at least one rank per task
        tasks = len(t.task_weights)
        _require(
            max(t.min_workers, 2) > min(t.max_workers, tasks - 1),
            "trainer.num_workers",
            f"1 (one worker draws each step's task) or at least one per task ({tasks})"
            + (" at every size from MIN to MAX" if t.elastic else ""),
            list(t.worker_range) if t.elastic else t.num_workers,
        )


def _validate_model_numbers(m: ModelConfig, t: TrainerConfig) -> None:
    _require(m.pretrained.pooling in POOLINGS, "model.pretrained.pooling", "|".join(POOLINGS), m.pretrained.pooling)
    _require(
        m.pretrained.output_dim >= 0,
        "model.pretrained.output_dim",
        ">= 0 (0 = no projection)",
        m.pretrained.output_dim,
    )
    _require(
        m.pretrained.train_layers >= -1,
        "model.pretrained.train_layers",
        ">= -1 (-1 = all)",
        m.pretrained.train_layers,
    )
    _finite_positive("model.score_scale", m.score_scale)
    _finite_positive("trainer.dense_lr_scale", t.dense_lr_scale)
    for task, scale in t.head_lr_scale.items():
        _require(
            task in t.task_weights,
            f"trainer.head_lr_scale.{task}",
            f"a trained task ({', '.join(t.task_weights)})",
            task,
        )
        _finite_positive(f"trainer.head_lr_scale.{task}", scale)
    for i, stage in enumerate(t.stages):
        _require(stage.batch_size >= 1, f"trainer.stages[{i}].batch_size", ">= 1", stage.batch_size)
        _finite_positive(f"trainer.stages[{i}].lr", stage.lr)
        _require(stage.start_step >= 0, f"trainer.stages[{i}].start_step", ">= 0", stage.start_step)
    for task, weight in t.task_weights.items():
        _finite_positive(f"trainer.task_weights.{task}", weight)


def _validate_encoder_sizes(m: ModelConfig) -> None:
    try:
        m.check_sizes()
    except ValueError as err:
        raise ConfigError(str(err)) from None
