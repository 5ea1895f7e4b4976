"""Pure-torch models: encoders, task heads, losses and checkpoints (no Ray, no MLflow)."""

from convsts.models.checkpoint import SentenceEncoder, load, save_checkpoint

__all__ = ["SentenceEncoder", "load", "save_checkpoint"]
