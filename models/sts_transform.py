"""The paper's "tuned" STS variant: one matrix W learned on STS-B train and applied to both
sentence embeddings, scored with 5 (1 - arccos(cos(uW, vW)) / pi) and selected on dev.

Pure torch and numpy: `fit_sts_transform` takes embeddings, so Tune trials can share them
through the object store instead of re-encoding. The matrix is saved as `sts_transform.safetensors`
in the checkpoint folder (by `convsts evaluate`), with its hyperparameters and dev score as
metadata; a matrix of another origin may have its own name there, `sts_transform_<name>.safetensors`,
so neither replaces the other. `convsts tune --space sts_matrix` writes its matrix only into its
own --out (the checkpoint is only read). `encode(tuned=True)` applies the checkpoint's,
`encode(tuned=NAME)` a named one, `encode(tuned="DIR/sts_transform.safetensors")` a file.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save as safetensors_bytes

from convsts.io import storage
from convsts.models.config import StsTransformConfig
from convsts.models.similarity import angular_score, angular_score_np, pearson, pearson_t

FILE_NAME = "sts_transform.safetensors"
FILE_PATTERN = "sts_transform*.safetensors"  # every matrix's file, named or not (a glob)


def file_name(name: str = "") -> str:
    """The file of the matrix called `name` ("" = the one `convsts evaluate` fits)."""
    return FILE_NAME if not name else f"sts_transform_{name}.safetensors"


@dataclass
class StsTransform:
    matrix: np.ndarray  # (dim, out_dim)
    config: StsTransformConfig
    dev_pearson: float
    best_epoch: int
    history: list[float] = field(default_factory=list)  # dev Pearson after each epoch

    def apply(self, emb: np.ndarray) -> np.ndarray:
        return emb @ self.matrix  # (n, dim) @ (dim, out_dim) -> (n, out_dim)

    def score(self, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        return angular_score_np(self.apply(u), self.apply(v))

    def save(self, folder: str | Path, name: str = "") -> Path:
        path = Path(folder) / file_name(name)
        meta = {
            "config": json.dumps(dataclasses.asdict(self.config)),
            "dev_pearson": repr(self.dev_pearson),
            "best_epoch": str(self.best_epoch),
            "history": json.dumps(self.history),
        }
        matrix = {"matrix": np.ascontiguousarray(self.matrix, dtype=np.float32)}
        storage.write_bytes(path, safetensors_bytes(matrix, metadata=meta))  # a full disk names the file
        return path


def load_sts_transform(folder: str | Path, name: str = "") -> StsTransform | None:
    """The matrix `name` saved in a checkpoint folder, or None when there is none."""
    path = Path(folder) / file_name(name)
    return read_sts_transform(path) if path.is_file() else None


def read_sts_transform(path: str | Path) -> StsTransform:
    """A matrix file as StsTransform.save wrote it (a checkpoint's, or a sweep's DIR/sts_transform.safetensors)."""
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata()
        matrix = f.get_tensor("matrix")
    return StsTransform(
        matrix,
        StsTransformConfig(**json.loads(meta["config"])),
        float(meta["dev_pearson"]),
        int(meta["best_epoch"]),
        json.loads(meta["history"]),
    )


def initial_matrix(dim: int, cfg: StsTransformConfig) -> torch.Tensor:
    out = cfg.rank or dim
    if cfg.init == "identity":
        return torch.eye(dim, out)  # the first `out` coordinates when low rank
    gen = torch.Generator().manual_seed(cfg.seed)
    q, _ = torch.linalg.qr(torch.randn(dim, max(dim, out), generator=gen))  # orthonormal columns
    return q[:, :out].contiguous()


EpochCallback = Callable[[int, float, float, np.ndarray | None], None]


def fit_sts_transform(
    train: dict[str, np.ndarray],
    dev: dict[str, np.ndarray],
    cfg: StsTransformConfig,
    on_epoch: EpochCallback | None = None,
) -> StsTransform:
    """train/dev: {"u": (n, d), "v": (n, d), "score": (n,) gold on 0-5}. Keeps the epoch best on dev.

    `on_epoch(epoch, dev_pearson, best_so_far, matrix_if_new_best_else_None)` runs after each epoch
    (Tune reports from it, and a scheduler may stop the fit there)."""
    cfg.validate()
    torch.manual_seed(cfg.seed)
    u = torch.tensor(np.asarray(train["u"], dtype=np.float32))
    v = torch.tensor(np.asarray(train["v"], dtype=np.float32))
    gold = torch.tensor(np.asarray(train["score"], dtype=np.float32))
    dim = u.shape[1]
    w0 = initial_matrix(dim, cfg)  # (d, out)
    w = torch.nn.Parameter(w0.clone())
    opt = torch.optim.Adam([w], lr=cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed)

    def dev_pearson(matrix: np.ndarray) -> float:
        return pearson(angular_score_np(dev["u"] @ matrix, dev["v"] @ matrix), np.asarray(dev["score"]))

    best_matrix = w0.numpy().copy()
    best = dev_pearson(best_matrix)
    best_epoch, history = 0, []
    for epoch in range(1, cfg.epochs + 1):
        order = torch.randperm(len(u), generator=gen)
        for start in range(0, len(u), cfg.batch_size):
            idx = order[start : start + cfg.batch_size]
            if len(idx) < 2:
                continue
            pred = angular_score(u[idx] @ w, v[idx] @ w)  # (B,)
            if cfg.loss == "mse":
                loss = torch.mean((pred - gold[idx]) ** 2)
            else:
                loss = -pearson_t(pred, gold[idx])
            if cfg.weight_decay > 0:
                loss = loss + cfg.weight_decay * torch.sum((w - w0) ** 2)
            opt.zero_grad()
            loss.backward()
            opt.step()
        matrix = w.detach().numpy().copy()
        r = dev_pearson(matrix)
        history.append(r)
        improved = bool(np.isfinite(r) and (not np.isfinite(best) or r > best))
        if improved:
            best, best_matrix, best_epoch = r, matrix, epoch
        if on_epoch is not None:
            on_epoch(epoch, r, best, matrix if improved else None)
    return StsTransform(best_matrix, cfg, float(best), best_epoch, history)
