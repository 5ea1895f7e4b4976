"""Whether a run's resource requests fit the cluster node by node.

Ray places each task worker, each Ray Data task and each trial function whole on one node, and
waits forever for a request that fits on no node ("Cluster resources are not enough to run any
task"): 2.3 free CPUs spread 0.9/0.4/0.4 over three nodes hold no 1-CPU read task. So a run is
checked against the nodes that exist, before any work: the workers (trainer.num_workers, the MIN of an elastic group, x
trainer.cpus_per_worker CPUs, one GPU each with trainer.use_gpu), one whole CPU for Ray Data's
tasks beside them (its file-listing task asks for a whole CPU, whatever the read asks), and for a
sweep each trial's function too. The requests are placed in the order Ray reserves them, each as
Ray may place it, taking the worst case where Ray chooses: a trial function may land on any node
(the one with the most room: it breaks the largest whole CPU), SPREAD workers go to distinct nodes
(those with the most room), PACK workers and Ray Data's task to the node with the least room that
holds them. A request that cannot be placed is refused in one line naming the keys to change (a
sweep's trial function on a third node left a 3-node cluster of 1 CPU each with no whole CPU, and
its trial waited forever).
"""

from __future__ import annotations

import copy
import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from convsts.io.errors import ConfigError

if TYPE_CHECKING:
    from convsts.ray_jobs.config.schema import RunConfig

DATA_TASK_CPU = 1.0  # Ray Data's read tasks (ListFiles, ReadParquet) each ask for a whole CPU
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
    strategy places them), then a Ray Data task beside them."""
    t = cfg.trainer
    place = PLACES.get(t.placement_strategy, LEAST)
    worker = Ask("task worker", t.cpus_per_worker, 1.0 if t.use_gpu else 0.0, place)
    return [worker] * (t.min_workers if workers is None else workers) + [Ask("Ray Data read task", DATA_TASK_CPU)]


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
    room = [{"CPU": n.get("CPU", 0.0), "GPU": n.get("GPU", 0.0)} for n in nodes]
    left: list[Ask] = []
    spread_used: set[int] = set()
    for ask in asks:
        fits = [i for i, r in enumerate(room) if r["CPU"] + EPSILON >= ask.cpu and r["GPU"] + EPSILON >= ask.gpu]
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
        room[node]["CPU"] -= ask.cpu
        room[node]["GPU"] -= ask.gpu
    return left, room


def _describe(nodes: list[Node]) -> str:
    shown = [f"{n.get('CPU', 0.0):g} CPU" + (f" + {n.get('GPU', 0.0):g} GPU" if n.get("GPU") else "") for n in nodes]
    return f"{len(nodes)} node(s): {', '.join(shown) or 'none'}"


def elastic_size(cfg: RunConfig, nodes: list[Node]) -> int:
    """The size Ray Train's elastic policy starts a group at on `nodes`: as many workers as the
    nodes hold by the workers' own requests (each node's CPUs and GPUs over a worker's), at most MAX.
    It leaves no room for Ray Data on purpose: workers_that_fit is what fits beside Ray Data."""
    t = cfg.trainer
    held = 0
    for node in nodes:
        counts = [int(node.get("CPU", 0.0) / t.cpus_per_worker + EPSILON)]
        if t.use_gpu:
            counts.append(int(node.get("GPU", 0.0) + EPSILON))
        held += min(counts)
    return min(held, t.max_workers)


HEAD_RESOURCE = "node:__internal_head__"  # the resource Ray gives the head node alone


def clusters_left(nodes: list[Node]) -> Iterator[list[Node]]:
    """`nodes`, then every cluster their losses can leave, largest first: the head (the node holding
    HEAD_RESOURCE, else the first) always stays, any number of each shape of the other nodes goes
    (nodes alike in CPUs and GPUs are one shape, so a cluster of many like nodes gives few cases)."""
    head = next((i for i, n in enumerate(nodes) if n.get(HEAD_RESOURCE)), 0)
    shapes = Counter((n.get("CPU", 0.0), n.get("GPU", 0.0)) for i, n in enumerate(nodes) if i != head)
    kept = sorted(itertools.product(*(range(count, -1, -1) for count in shapes.values())), key=lambda k: -sum(k))
    for counts in kept:
        others = [{"CPU": cpu, "GPU": gpu} for (cpu, gpu), k in zip(shapes, counts) for _ in range(k)]
        yield [nodes[head], *others] if nodes else []


def _starved(cfg: RunConfig, nodes: list[Node]) -> int:
    """The size Ray Train would give an elastic group on `nodes` when that group leaves Ray Data's
    reads no whole CPU (they would wait forever), else 0 (the group fits beside them, or fewer than
    MIN fit and Ray waits for room)."""
    size = elastic_size(cfg, nodes)
    if size < cfg.trainer.min_workers or not unplaced(nodes, training_asks(cfg, size))[0]:
        return 0
    return size


def _check_elastic_leaves_data_room(cfg: RunConfig, nodes: list[Node]) -> None:
    """An elastic group that Ray would size to take the CPU Ray Data's reads need, on the cluster
    now or on any cluster its nodes' losses can leave, is refused in one line: its reads would wait
    forever (Ray sizes the group by the workers' requests alone, at every restart)."""
    t = cfg.trainer
    for left in clusters_left(nodes):
        size = _starved(cfg, left)
        if not size:
            continue
        lost = len(nodes) - len(left)
        where = (
            f"on the cluster's {_describe(left)}"
            if not lost
            else f"when {lost} of the cluster's {len(nodes)} nodes are lost (on the {_describe(left)} left)"
        )
        safe = _largest_safe_max(cfg, nodes)
        remedy = f", or lower MAX to {safe}" if safe >= t.min_workers else ""
        raise ConfigError(
            f"trainer.num_workers={list(t.worker_range)}: Ray sizes an elastic group by the workers' requests "
            f"alone and would start {size} worker(s) x {t.cpus_per_worker:g} CPU {where}, "
            f"leaving no whole CPU for Ray Data's reads (they would wait forever): set "
            f"trainer.cpus_per_worker so that the head keeps a CPU in which no worker fits (fewer CPUs "
            f"than a worker asks for){remedy}"
        )


def _largest_safe_max(cfg: RunConfig, nodes: list[Node]) -> int:
    """The largest MAX from trainer.num_workers' MAX down to MIN whose group leaves Ray Data a CPU on
    every cluster the nodes' losses can leave (MIN - 1 when none does)."""
    trial = copy.deepcopy(cfg)
    t = trial.trainer
    for top in range(cfg.trainer.max_workers, cfg.trainer.min_workers - 1, -1):
        t.num_workers = [t.min_workers, top]
        if not any(_starved(trial, left) for left in clusters_left(nodes)):
            return top
    return cfg.trainer.min_workers - 1


def check_training_fits(cfg: RunConfig, nodes: list[Node]) -> int:
    """Refuse, in one line, a training run whose requests cannot all be placed on `nodes` (an elastic
    group's MIN); else the number of workers that fit now (workers_that_fit)."""
    left, _ = unplaced(nodes, training_asks(cfg))
    t = cfg.trainer
    if left and t.placement_strategy in STRICT_ADVICE and not unplaced(nodes, training_asks(_relaxed(cfg)))[0]:
        raise ConfigError(
            f"trainer: {t.min_workers} task worker(s) do not fit on the cluster's {_describe(nodes)}: "
            f"{STRICT_ADVICE[t.placement_strategy]}"
        )
    if left:
        least = f"the elastic group's MIN, {t.min_workers}," if t.elastic else f"{t.min_workers}"
        need = f"{least} task worker(s) x {t.cpus_per_worker:g} CPU" + (" + 1 GPU" if t.use_gpu else "")
        raise ConfigError(
            f"trainer: {need} and {DATA_TASK_CPU:g} CPU for Ray Data's reads do not fit on the cluster's "
            f"{_describe(nodes)} (each is placed whole on one node; {len(left)} would wait forever): lower "
            f"trainer.cpus_per_worker or trainer.num_workers{', or set trainer.use_gpu=false' if t.use_gpu else ''}, "
            f"or add nodes"
        )
    fit_now = workers_that_fit(cfg, nodes)
    if t.elastic:
        _check_elastic_leaves_data_room(cfg, nodes)
    return fit_now


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
        raise ConfigError(
            f"a trial ({TRIAL_FUNCTION_CPU:g} CPU for the trial function, {t.min_workers} task worker(s) x "
            f"{t.cpus_per_worker:g} CPU{' + 1 GPU' if t.use_gpu else ''}, {DATA_TASK_CPU:g} CPU for Ray Data) "
            f"does not fit on the cluster's {_describe(nodes)}: lower trainer.cpus_per_worker or "
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
