"""Task heads on top of the shared encoder, and the multitask model that holds them."""

from __future__ import annotations

from typing import Dict

import torch
from torch import nn

from models.config import ModelConfig
from models.encoders import BiLstmMaxEncoder, DanEncoder, TransformerSentenceEncoder, encode_inputs

TASKS = ("reddit", "snli")


class ResponseHead(nn.Module):
    """The extra feed-forward network applied to the response embedding only, as a residual
    branch whose output layer starts at zero: an untrained head is the identity, so training starts
    from the encoder's own similarity (lexical overlap for a fresh DAN) instead of scrambling it."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.Tanh(), nn.Linear(hidden, dim))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, response: torch.Tensor) -> torch.Tensor:
        return response + self.net(response)  # (B, D)


class NliHead(nn.Module):
    """3-way classifier on (u, v, |u - v|, u * v) through one hidden layer."""

    def __init__(self, dim: int, hidden: int, classes: int = 3):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4 * dim, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        features = torch.cat([u, v, (u - v).abs(), u * v], dim=-1)  # (B, 4D)
        return self.net(features)  # (B, classes)


def build_encoder(config: ModelConfig, num_words: int, num_bigrams: int) -> nn.Module:
    if config.encoder == "dan":
        return DanEncoder(config.dan, num_words, num_bigrams)
    if config.encoder == "transformer":
        return TransformerSentenceEncoder(config.transformer, num_words)
    if config.encoder == "bilstm":
        return BiLstmMaxEncoder(config.bilstm, num_words)
    raise ValueError(f"unknown encoder {config.encoder!r}")


class MultitaskModel(nn.Module):
    """One shared encoder; a head per task. Input and response share (tie) the encoder."""

    def __init__(self, config: ModelConfig, num_words: int, num_bigrams: int):
        super().__init__()
        self.config = config
        self.encoder = build_encoder(config, num_words, num_bigrams)
        dim = self.encoder.output_dim
        self.heads = nn.ModuleDict(
            {
                "reddit": ResponseHead(dim, config.response_hidden),
                "snli": NliHead(dim, config.nli_hidden, config.nli_classes),
            }
        )

    def encode(self, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
        return encode_inputs(self.encoder, inputs)  # (B, D)

    def encode_both(self, first: Dict[str, torch.Tensor], second: Dict[str, torch.Tensor]):
        """Both sides of a pair through the tied encoder in one call: one pass over the embedding
        tables, so each table gets one sparse gradient per step rather than two to be summed.
        Sentences are encoded independently, so this equals two separate calls."""
        if first.keys() != second.keys() or any(first[k].shape[1:] != second[k].shape[1:] for k in first):
            return self.encode(first), self.encode(second)
        n = next(iter(first.values())).shape[0]
        joint = self.encode({k: torch.cat([first[k], second[k]]) for k in first})  # (2B, D)
        return joint[:n], joint[n:]

    def reddit_embeddings(self, context: Dict[str, torch.Tensor], response: Dict[str, torch.Tensor]):
        """(context (B, D), response after the response-side network (B, D))."""
        u, v = self.encode_both(context, response)
        return u, self.heads["reddit"](v)

    def nli_logits(self, premise: Dict[str, torch.Tensor], hypothesis: Dict[str, torch.Tensor]) -> torch.Tensor:
        return self.heads["snli"](*self.encode_both(premise, hypothesis))  # (B, 3)
