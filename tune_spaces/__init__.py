"""Named search spaces for `convsts tune --space NAME`.

A space is a `TuneSpace` in a module `tune_spaces/<NAME>.py` (bound to the name `SPACE`), or any
importable `package.module:ATTRIBUTE`. Its parameters are dotted keys of the run config
(`eval.tuned.lr`, `data.snli_fraction`, ...), so a trial is the base config plus those overrides:
adding a space needs no change to the runner.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from convsts import tune_spaces

OBJECTIVES = ("sts_matrix", "train")
# The STS-B metrics a data-quantity curve (Figure 8) plots: all of STS-B and its captions genre, where
# the paper finds SNLI helps most, on dev and test.
CURVE_METRICS = ["stsb/dev/pearson", "stsb/dev/captions/pearson", "stsb/test/pearson", "stsb/test/captions/pearson"]


@dataclass
class TuneSpace:
    name: str
    description: str
    # "sts_matrix": fit the STS transformation on embeddings computed once (needs --checkpoint);
    # "train": one multitask training per trial, warm-started from --reddit-checkpoint, then evaluated.
    objective: str
    metric: str  # chosen on this (a dev-split metric)
    mode: str  # max | min
    params: Callable[[], dict[str, Any]]  # dotted config key -> ray.tune domain or value
    fixed: list[str] = field(default_factory=list)  # dotted overrides applied to every trial
    num_samples: int = 1  # samples of the random dimensions (grids are crossed with them)
    scheduler: str | None = None  # "asha" or None; ASHA needs per-iteration reports of `metric`
    max_t: int = 0  # ASHA: the most iterations a trial runs (epochs for sts_matrix)
    report: list[str] = field(default_factory=list)  # metrics that go into trials.csv, curve.csv / the summary
    # A train space's curve: the metrics of `report` against this parameter (curve.csv, curve.png;
    # "data.snli_fraction": the data-quantity curve). "" = none: trials.csv holds every trial.
    curve: str = ""
    # A train space's table: one row per value of this parameter, each report metric as the mean and
    # standard deviation over the trials that share it (seeds): table.md, the parent run's description.
    table: str = ""

    def validate(self) -> TuneSpace:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"space {self.name}: objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.mode not in ("max", "min"):
            raise ValueError(f"space {self.name}: mode must be max or min, got {self.mode!r}")
        for kind, key in (("curve", self.curve), ("table", self.table)):
            if key and key not in self.params():
                raise ValueError(f"space {self.name}: {kind} {key!r} is not one of its parameters")
        if self.scheduler not in (None, "asha"):
            raise ValueError(f"space {self.name}: scheduler must be asha or None, got {self.scheduler!r}")
        return self


def get_space(name: str) -> TuneSpace:
    """`sts_matrix` -> convsts.tune_spaces.sts_matrix.SPACE; `my.module:MY_SPACE` -> that attribute."""
    module_name, _, attr = name.partition(":")
    if "." not in module_name and not attr:
        module_name = f"convsts.tune_spaces.{module_name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name == module_name:
            raise ValueError(
                f"unknown tune space {name!r}: no module {module_name}; built in: {', '.join(builtin_spaces())}"
            ) from None
        raise
    space = getattr(module, attr or "SPACE", None)
    if not isinstance(space, TuneSpace):
        raise ValueError(f"{module_name} has no TuneSpace named {attr or 'SPACE'}")
    return space.validate()


def builtin_spaces() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(tune_spaces.__path__))
