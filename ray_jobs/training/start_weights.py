"""Where a run's weights start, as every worker builds them: the seeded initialisation (or the pretrained weights), a warm start, or a checkpoint restored over them with its train state."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from convsts.models.checkpoint import Hashed, TrainState, build_model, load_model, load_train_state, load_weights
from convsts.ray_jobs.config.schema import RunConfig
from convsts.ray_jobs.tasks import model_heads, trained_tasks
from convsts.ray_jobs.training.train_step import seed_everything


def initial_model(cfg: RunConfig, tokenizer, warm_start: bool = True, hashed: Sequence[Hashed] = ()):
    """The weights a fresh run starts from, as every worker builds them: the seeded initialisation
    (the pretrained weights for model.encoder=pretrained), then the warm start when there is one
    (`warm_start=False`: the caller restores a checkpoint over it). `trainer.steps=0` saves exactly
    this model; the demo scores it beside the trained one. `hashed`: the folders the driver hashed
    (a worker does not hash them again)."""

    seed_everything(cfg.seed)  # identical initial weights on every rank
    model = build_model(copy.deepcopy(cfg.model), tokenizer, model_heads(cfg))  # building fills hf_config
    warm_heads = [t for t, task in trained_tasks(cfg).items() if task.keeps_head_on_warm_start]
    if warm_start:
        restore(model, warm_start=cfg.trainer.warm_start or None, warm_heads=warm_heads, hashed=hashed)
    return model


def restore(
    model,
    checkpoint_dir: str | None = None,
    resume_from: str | None = None,
    warm_start: str | None = None,
    warm_heads: Sequence[str] = (),
    hashed: Sequence[Hashed] = (),
) -> TrainState | None:
    """Load weights into `model` from the first source given and return the train state to
    continue from (None for a fresh or warm-started run):
      checkpoint_dir  Ray Train's latest checkpoint after a worker-group restart;
      resume_from     a checkpoint the user resumes (weights, optimizers, step, data position);
      warm_start      a checkpoint whose encoder (and the heads of `warm_heads`) initialise a new run."""
    source = checkpoint_dir or resume_from
    if source:
        # A head the checkpoint lacks keeps its initial weights (said by the driver).
        load_weights(model, source, hashed)
        return load_train_state(source)
    if warm_start:
        warm = load_model(warm_start, hashed).model
        model.encoder.load_state_dict(warm.encoder.state_dict())
        for task in warm_heads:
            if task in warm.heads and task in model.heads:
                model.heads[task].load_state_dict(warm.heads[task].state_dict())
    return None
