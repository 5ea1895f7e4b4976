"""Per-task loss, accuracy and throughput over the steps since the last log line."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import torch


class MetricWindow:
    """Per-task loss and accuracy over the steps since the last log line. Values are kept as device
    tensors and read once per window, so a step never waits for the device to report its loss."""

    def __init__(self, tasks: Sequence[str]):
        self.tasks = list(tasks)
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, dict[str, Any]] = {t: {"loss": 0.0, "acc": 0.0, "n": 0, "pairs": 0} for t in self.tasks}
        self.started = time.time()

    def add(self, task: str, loss: torch.Tensor, accuracy: torch.Tensor, pairs: int) -> None:
        w = self.sums[task]
        w["loss"] = w["loss"] + loss
        w["acc"] = w["acc"] + accuracy
        w["n"] += 1
        w["pairs"] += pairs

    def summary(self, tasks: Sequence[str]) -> dict[str, float]:
        """{task/loss, task/batch_accuracy, task/pairs_per_s} of `tasks` over the window."""
        elapsed = max(time.time() - self.started, 1e-9)
        out: dict[str, float] = {}
        for t in tasks:
            w = self.sums[t]
            if w["n"]:
                out.update(
                    {
                        f"{t}/loss": float(w["loss"]) / w["n"],
                        f"{t}/batch_accuracy": float(w["acc"]) / w["n"],
                        f"{t}/pairs_per_s": w["pairs"] / elapsed,
                    }
                )
        return out

    def seconds(self) -> float:
        return max(time.time() - self.started, 1e-9)


def format_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s"
