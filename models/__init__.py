"""Pure-torch models: encoders, task heads, losses and checkpoints (no Ray, no MLflow).

`from convsts.models import load` loads torch; `convsts.models.config` (the dataclasses a run config
holds) does not, so a command that only reads a config, such as `convsts prepare`, starts without it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from convsts.models.checkpoint import save_checkpoint
    from convsts.models.sentence_encoder import SentenceEncoder, load

__all__ = ["SentenceEncoder", "load", "save_checkpoint"]
_HOME = {"SentenceEncoder": "sentence_encoder", "load": "sentence_encoder", "save_checkpoint": "checkpoint"}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(  # its module loads torch, which the config dataclasses do not need
        importlib.import_module(f"{__name__}.{_HOME[name]}"), name
    )
