"""Whether a run's resource requests fit the cluster node by node.

Ray places each task worker, each Ray Data task and each trial function whole on one node, and
waits forever for a request that fits on no node ("Cluster resources are not enough to run any
task"): 2.3 free CPUs spread 0.9/0.4/0.4 over three nodes hold no 1-CPU read task. So a run is
checked against the nodes that exist, before any work: the workers (trainer.num_workers x
trainer.cpus_per_worker CPUs, one GPU each with trainer.use_gpu), one whole CPU for Ray Data's
read tasks beside them, and for a sweep each trial's function too. Placement is first fit
decreasing onto the node with the least room that still fits (best fit); a request it cannot
place is refused in one line naming the keys to change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from convsts.ray_jobs.errors import ConfigError

if TYPE_CHECKING:
    from convsts.ray_jobs.config import RunConfig

DATA_TASK_CPU = 1.0  # Ray Data's read tasks (ListFiles, ReadParquet) each ask for a whole CPU
TRIAL_FUNCTION_CPU = 0.1  # a sweep's trial function only waits on its TorchTrainer
EPSILON = 1e-9


@dataclass(frozen=True)
class Ask:
    """One request Ray places whole on one node."""

    what: str
    cpu: float
    gpu: float = 0.0


Node = dict[str, float]  # a node's resources: {"CPU": 16.0, "GPU": 1.0, ...}


def training_asks(cfg: RunConfig) -> list[Ask]:
    """A training run's requests: its task workers and one Ray Data read task beside them."""
    t = cfg.trainer
    worker = Ask("task worker", t.cpus_per_worker, 1.0 if t.use_gpu else 0.0)
    return [worker] * t.num_workers + [Ask("Ray Data read task", DATA_TASK_CPU)]


def trial_asks(cfg: RunConfig) -> list[Ask]:
    """One training trial of a sweep: its function plus a training run's requests."""
    return [Ask("trial function", TRIAL_FUNCTION_CPU), *training_asks(cfg)]


def unplaced(nodes: list[Node], asks: list[Ask]) -> tuple[list[Ask], list[Node]]:
    """(the requests that fit on no node, the nodes' room left) after placing the largest first,
    each on the node with the least room that still holds it."""
    room = [{"CPU": n.get("CPU", 0.0), "GPU": n.get("GPU", 0.0)} for n in nodes]
    left = []
    for ask in sorted(asks, key=lambda a: (a.gpu, a.cpu), reverse=True):
        fits = [r for r in room if r["CPU"] + EPSILON >= ask.cpu and r["GPU"] + EPSILON >= ask.gpu]
        if not fits:
            left.append(ask)
            continue
        node = min(fits, key=lambda r: (r["GPU"] - ask.gpu, r["CPU"] - ask.cpu))
        node["CPU"] -= ask.cpu
        node["GPU"] -= ask.gpu
    return left, room


def _describe(nodes: list[Node]) -> str:
    shown = [f"{n.get('CPU', 0.0):g} CPU" + (f" + {n.get('GPU', 0.0):g} GPU" if n.get("GPU") else "") for n in nodes]
    return f"{len(nodes)} node(s): {', '.join(shown) or 'none'}"


def check_training_fits(cfg: RunConfig, nodes: list[Node]) -> None:
    """Refuse, in one line, a training run whose requests cannot all be placed on `nodes`."""
    left, _ = unplaced(nodes, training_asks(cfg))
    if left:
        t = cfg.trainer
        need = f"{t.num_workers} task worker(s) x {t.cpus_per_worker:g} CPU" + (" + 1 GPU" if t.use_gpu else "")
        raise ConfigError(
            f"trainer: {need} and {DATA_TASK_CPU:g} CPU for Ray Data's reads do not fit on the cluster's "
            f"{_describe(nodes)} (each is placed whole on one node; {len(left)} would wait forever): lower "
            f"trainer.cpus_per_worker or trainer.num_workers{', or set trainer.use_gpu=false' if t.use_gpu else ''}, "
            f"or add nodes"
        )


def trials_at_once(cfg: RunConfig, nodes: list[Node]) -> int:
    """How many training trials fit on `nodes` side by side; refuses a sweep where none fits."""
    count, room = 0, nodes
    while not (placed := unplaced(room, trial_asks(cfg)))[0]:
        count, room = count + 1, placed[1]
    if not count:
        t = cfg.trainer
        raise ConfigError(
            f"a trial ({TRIAL_FUNCTION_CPU:g} CPU for the trial function, {t.num_workers} task worker(s) x "
            f"{t.cpus_per_worker:g} CPU{' + 1 GPU' if t.use_gpu else ''}, {DATA_TASK_CPU:g} CPU for Ray Data) "
            f"does not fit on the cluster's {_describe(nodes)}: lower trainer.cpus_per_worker or "
            f"trainer.num_workers, or add nodes"
        )
    return count


def alive_nodes() -> list[Node]:
    """The resources of each node of the connected Ray cluster that is alive."""
    import ray  # deferred: Ray takes seconds to import; Ray-free paths and `--help` skip it

    return [dict(node["Resources"]) for node in ray.nodes() if node.get("Alive")]
