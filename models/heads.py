"""Task heads on top of the shared encoder, and the multitask model that holds them.

Heads are named by kind (`HEADS`: "response", "nli") or by an importable "package.module:Class"
for a head defined outside this file. A head is built as `Head(dim, model_config)`. Which task uses
which head kind is the task's declaration (ray_jobs/tasks/); the model only stores {task: kind},
which each checkpoint's config.json keeps so that `convsts.models.sentence_encoder.load` rebuilds the same heads.
"""

from __future__ import annotations

import importlib
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from convsts.models.config import ModelConfig
from convsts.models.encoders import build_encoder

# The heads of a model built without naming them: the paper's pair (Reddit response, SNLI classifier).
DEFAULT_HEADS = {"reddit": "response", "snli": "nli"}


class ResponseHead(nn.Module):
    """The extra feed-forward network applied to the response embedding only, as a residual
    branch whose output layer starts at zero: an untrained head is the identity, so training starts
    from the encoder's own similarity (lexical overlap for a fresh DAN) instead of scrambling it."""

    def __init__(self, dim: int, config: ModelConfig):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, config.response_hidden), nn.Tanh(), nn.Linear(config.response_hidden, dim)
        )
        last = cast(nn.Linear, self.net[-1])
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)

    def forward(self, response: torch.Tensor) -> torch.Tensor:
        return response + self.net(response)  # (B, D)


class NliHead(nn.Module):
    """3-way classifier on (u, v, |u - v|, u * v) through one hidden layer."""

    def __init__(self, dim: int, config: ModelConfig):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(4 * dim, config.nli_hidden), nn.ReLU(), nn.Linear(config.nli_hidden, config.nli_classes)
        )

    def forward(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        features = torch.cat([u, v, (u - v).abs(), u * v], dim=-1)  # (B, 4D)
        return self.net(features)  # (B, classes)


HEADS: dict[str, type] = {"response": ResponseHead, "nli": NliHead}


def head_class(kind: str) -> type:
    if kind in HEADS:
        return HEADS[kind]
    module_name, sep, attr = kind.partition(":")
    if not sep:
        raise ValueError(f"unknown head kind {kind!r}: expected one of {'|'.join(HEADS)} or package.module:Class")
    return getattr(importlib.import_module(module_name), attr)


class MultitaskModel(nn.Module):
    """One shared encoder; a head per task. Both sides of a pair share (tie) the encoder."""

    def __init__(self, config: ModelConfig, num_words: int, num_bigrams: int, heads: dict[str, str] | None = None):
        super().__init__()
        self.config = config
        self.head_kinds = dict(heads or DEFAULT_HEADS)  # {task: head kind}
        self.encoder = build_encoder(config, num_words, num_bigrams)
        dim = self.encoder.output_dim
        self.heads = nn.ModuleDict({task: head_class(kind)(dim, config) for task, kind in self.head_kinds.items()})

    def sparse_parameters(self) -> list[torch.Tensor]:
        """Parameters whose gradients are sparse (the DAN's embedding tables)."""
        return self.encoder.sparse_parameters()

    def encode(self, inputs: dict[str, torch.Tensor], normalize: bool = True) -> torch.Tensor:
        """(B, D) sentence embeddings, of unit length unless `normalize=False` (the encoder's own output)."""
        emb = self.encoder(inputs)  # (B, D)
        return F.normalize(emb, dim=-1) if normalize else emb

    def encode_all(self, parts: list[dict[str, torch.Tensor]]) -> tuple[torch.Tensor, ...]:
        """Several batches of sentences through the tied encoder in one call (pair sides, mined
        negatives): one pass over the embedding tables, so each table gets one sparse gradient per
        step rather than several to be summed. Sentences are encoded independently, so this equals
        separate calls. Returns one (B_i, D) tensor per part."""
        first = parts[0]
        if any(p.keys() != first.keys() or any(p[k].shape[1:] != first[k].shape[1:] for k in first) for p in parts):
            return tuple(self.encode(p) for p in parts)
        sizes = [next(iter(p.values())).shape[0] for p in parts]
        joint = self.encode({k: torch.cat([p[k] for p in parts]) for k in first})  # (sum B_i, D)
        return tuple(joint.split(sizes))

    def encode_both(self, first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]):
        """Both sides of a pair (see encode_all)."""
        return self.encode_all([first, second])

    def task_of_head(self, kind: str) -> str:
        """The task whose head is of this kind (e.g. the response-side network's task)."""
        for task, k in self.head_kinds.items():
            if k == kind:
                return task
        raise KeyError(f"this model has no {kind!r} head (heads: {self.head_kinds})")
