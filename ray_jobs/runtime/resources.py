"""Whether a run's resource requests fit the cluster node by node.

Ray places each task worker and each trial function whole on one node, and waits forever for a
request that fits on no node: 2.3 free CPUs spread 0.9/0.4/0.4 over three nodes hold no 1-CPU
worker. So a run is checked against the nodes that exist, before any work: the workers
(trainer.num_workers, the MIN of an elastic group, x trainer.cpus_per_worker CPUs, one GPU each with
trainer.use_gpu), and for a sweep each trial's function too. The feed asks for no CPU a fit must
have: each task's dealer takes none, and its Ray Data tasks take a CPU only where the workers left
one free (else they share the workers', one at a time: feed_dealer), less those an elastic group
may still grow into (feed_dealer.CpuShare), so an elastic group of any size Ray gives it leaves
nothing waiting and can still grow. The requests are placed in the order Ray reserves them, each as Ray may
place it, taking the worst case where Ray chooses: a trial function may land on any node (the one
with the most room: it breaks the largest whole CPU), SPREAD workers go to distinct nodes (those
with the most room), PACK workers to the node with the least room that holds them. A request that cannot be placed is refused in one line naming the keys to change (a
sweep's trial function on a third node left a 3-node cluster of 1 CPU each with no whole CPU, and
its trial waited forever).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING

from convsts.io.errors import ConfigError

if TYPE_CHECKING:
    from convsts.ray_jobs.config.schema import RunConfig, TrainerConfig

TRIAL_FUNCTION_CPU = 0.1  # a sweep's trial function only waits on its TorchTrainer
EPSILON = 1e-9


@dataclass(frozen=True)
class Ask:
    """One request Ray places whole on one node; `place`: how Ray chooses the node, as the check
    assumes it (LEAST, MOST or SPREAD)."""

    what: str
    cpu: float
    gpu: float = 0.0
    place: str = "least"
    custom: tuple[tuple[str, float], ...] = ()  # trainer.worker_resources, as (name, amount) pairs

    def needs(self) -> dict[str, float]:
        """Every resource this request takes: {"CPU": ..., "GPU": ..., custom ones}."""
        return {"CPU": self.cpu, "GPU": self.gpu, **dict(self.custom)}


LEAST, MOST, SPREAD, STRICT_SPREAD = "least", "most", "spread", "strict_spread"
PLACES = {"SPREAD": SPREAD, "STRICT_SPREAD": STRICT_SPREAD}  # trainer.placement_strategy -> how workers are placed
# What a strict strategy demands, for its refusal: the one setting that no resource change can fix.
STRICT_ADVICE = {
    "STRICT_SPREAD": "trainer.placement_strategy=STRICT_SPREAD puts each task worker on a node of its own: set "
    "trainer.placement_strategy=SPREAD, lower trainer.num_workers, or add nodes",
}


Node = dict[str, float]  # a node's resources: {"CPU": 16.0, "GPU": 1.0, ...}


def training_asks(cfg: RunConfig, workers: int | None = None) -> list[Ask]:
    """A training run's requests in the order Ray reserves them: its task workers (`workers`, else
    trainer.num_workers' MIN: an elastic group starts with what fits, at least MIN; as its placement
    strategy places them)."""
    t = cfg.trainer
    return [worker_ask(t)] * (t.min_workers if workers is None else workers)


def worker_ask(t: TrainerConfig) -> Ask:
    """One task worker's request (TrainerConfig.worker_request: its CPUs, a GPU with trainer.use_gpu,
    trainer.worker_resources), placed by trainer.placement_strategy."""
    need = t.worker_request()
    custom = tuple(sorted((k, v) for k, v in need.items() if k not in ("CPU", "GPU")))
    return Ask("task worker", need["CPU"], need.get("GPU", 0.0), PLACES.get(t.placement_strategy, LEAST), custom)


def workers_that_fit(cfg: RunConfig, nodes: list[Node]) -> int:
    """The largest group size from trainer.num_workers' MIN to its MAX whose requests all fit on
    `nodes` now (MIN - 1 when not even MIN fits)."""
    t = cfg.trainer
    for n in range(t.max_workers, t.min_workers - 1, -1):
        if not unplaced(nodes, training_asks(cfg, n))[0]:
            return n
    return t.min_workers - 1


def trial_asks(cfg: RunConfig) -> list[Ask]:
    """One training trial of a sweep: its function (anywhere) first, then a training run's requests."""
    return [Ask("trial function", TRIAL_FUNCTION_CPU, place=MOST), *training_asks(cfg)]


def unplaced(nodes: list[Node], asks: list[Ask]) -> tuple[list[Ask], list[Node]]:
    """(the requests that fit on no node, the nodes' room left) after placing `asks` in order: LEAST
    on the node with the least room that still holds it, MOST on the one with the most, SPREAD on the
    one with the most among the nodes this call's SPREAD asks have not used yet (any, once all have;
    STRICT_SPREAD only those)."""
    room = [{"CPU": 0.0, "GPU": 0.0, **n} for n in nodes]
    left: list[Ask] = []
    spread_used: set[int] = set()
    for ask in asks:
        needs = ask.needs()
        fits = [i for i, r in enumerate(room) if all(r.get(k, 0.0) + EPSILON >= v for k, v in needs.items())]
        if ask.place == STRICT_SPREAD:
            fits = [i for i in fits if i not in spread_used]
        if not fits:
            left.append(ask)
            continue
        if ask.place == LEAST:
            node = min(fits, key=lambda i: (room[i]["GPU"] - ask.gpu, room[i]["CPU"] - ask.cpu))
        else:
            unused = [i for i in fits if i not in spread_used] if ask.place != MOST else []
            choices = unused or fits
            node = max(choices, key=lambda i: (room[i]["CPU"], room[i]["GPU"]))
            if ask.place != MOST:
                spread_used.add(node)
        for key, amount in needs.items():
            room[node][key] = room[node].get(key, 0.0) - amount
    return left, room


def _amounts(resources: dict[str, float], custom: list[str]) -> str:
    """ "2 CPU + 1 GPU + 1 trainer_node": the CPUs, and the GPUs and `custom` resources where there are any."""
    shown = [f"{resources.get('CPU', 0.0):g} CPU"] + [
        f"{resources[key]:g} {key}" for key in ["GPU", *custom] if resources.get(key)
    ]
    return " + ".join(shown)


def _describe(nodes: list[Node], custom: list[str]) -> str:
    shown = [_amounts(n, custom) for n in nodes]
    return f"{len(nodes)} node(s): {', '.join(shown) or 'none'}"


def _worker(t: TrainerConfig) -> tuple[str, list[str], str]:
    """(one worker's request, its custom resources' names, the keys that lower it) for a refusal line."""
    ask = worker_ask(t)
    custom = [name for name, _ in ask.custom]
    keys = "trainer.cpus_per_worker" + (", trainer.worker_resources" if custom else "")
    return _amounts(ask.needs(), custom), custom, keys


def check_training_fits(cfg: RunConfig, nodes: list[Node]) -> int:
    """Refuse, in one line, a training run whose requests cannot all be placed on `nodes` (an elastic
    group's MIN); else the number of workers that fit now (workers_that_fit)."""
    left, _ = unplaced(nodes, training_asks(cfg))
    t = cfg.trainer
    worker, custom, keys = _worker(t)
    if left and t.placement_strategy in STRICT_ADVICE and not unplaced(nodes, training_asks(_relaxed(cfg)))[0]:
        raise ConfigError(
            f"trainer: {t.min_workers} task worker(s) do not fit on the cluster's {_describe(nodes, custom)}: "
            f"{STRICT_ADVICE[t.placement_strategy]}"
        )
    if left:
        least = f"the elastic group's MIN, {t.min_workers}," if t.elastic else f"{t.min_workers}"
        raise ConfigError(
            f"trainer: {least} task worker(s) x {worker} do not fit on the cluster's "
            f"{_describe(nodes, custom)} (each is placed whole on one node; {len(left)} would wait forever): lower "
            f"{keys} or trainer.num_workers{', or set trainer.use_gpu=false' if t.use_gpu else ''}, "
            f"or add nodes"
        )
    return workers_that_fit(cfg, nodes)


def _relaxed(cfg: RunConfig) -> RunConfig:
    """`cfg` with its strict placement strategy relaxed (STRICT_SPREAD -> SPREAD): does only the strategy refuse?"""
    relaxed = copy.deepcopy(cfg)
    relaxed.trainer.placement_strategy = relaxed.trainer.placement_strategy.removeprefix("STRICT_")
    return relaxed


def trials_at_once(cfg: RunConfig, nodes: list[Node]) -> int:
    """How many training trials fit on `nodes` side by side; refuses a sweep where none fits."""
    count, room = 0, nodes
    while not (placed := unplaced(room, trial_asks(cfg)))[0]:
        count, room = count + 1, placed[1]
    if not count:
        t = cfg.trainer
        worker, custom, keys = _worker(t)
        raise ConfigError(
            f"a trial ({TRIAL_FUNCTION_CPU:g} CPU for the trial function, {t.min_workers} task worker(s) x "
            f"{worker}) does not fit on the cluster's {_describe(nodes, custom)}: lower {keys} or "
            f"trainer.num_workers, or add nodes"
        )
    return count


def alive_nodes() -> list[Node]:
    """The resources of each node of the connected Ray cluster that is alive."""
    import ray

    return [dict(node["Resources"]) for node in ray.nodes() if node.get("Alive")]


def cluster_cpus() -> int:
    """The CPUs of the connected Ray cluster's live nodes, together (at least 1)."""
    return max(1, int(sum(node.get("CPU", 0) for node in alive_nodes())))
