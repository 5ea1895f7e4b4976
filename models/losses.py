"""Losses as pure functions of embeddings and logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def in_batch_softmax_loss(
    context: torch.Tensor,
    response: torch.Tensor,
    scale: float = 1.0,
    symmetric: bool = False,
    negatives: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each response is the positive for its own context and a negative for the other K-1.

    context, response: (K, D). Scores are dot products times `scale`; the loss is the mean over
    the K contexts of -log softmax(scores[i])[i]. `negatives` (M, D), e.g. mined hard negatives:
    extra candidates for every context (a softmax over K + M). `symmetric`: the mean of that and
    the same over the K responses (each context is the positive for its own response, column-wise).
    """
    candidates = response if negatives is None else torch.cat([response, negatives])  # (K + M, D)
    scores = scale * (context @ candidates.T)  # (K, K + M)
    k = context.shape[0]
    targets = torch.arange(k, device=scores.device)  # (K,)
    loss = F.cross_entropy(scores, targets)
    if symmetric:
        loss = (loss + F.cross_entropy(scores[:, :k].T, targets)) / 2
    return loss


def nli_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of (B, 3) logits against (B,) labels in {0, 1, 2}."""
    return F.cross_entropy(logits, labels)


def in_batch_accuracy(context: torch.Tensor, response: torch.Tensor) -> torch.Tensor:
    scores = context @ response.T  # (K, K)
    return (scores.argmax(dim=1) == torch.arange(scores.shape[0], device=scores.device)).float().mean()
