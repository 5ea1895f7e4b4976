"""Worker processes that died while a command's Ray work ran, one line each.

Ray prints a worker that dies unexpectedly (a native abort at start-up, the OOM killer, a segfault
in a library) as the dead process's own stack, if at all, interleaved with the run's console, and
then starts another worker in its place: the run goes on and the crash passes unnoticed.
`reporting_worker_deaths` asks Ray's state API, when the work ends, for the worker processes that
ended with an unexpected exit in that time on the cluster, and logs a line for each: its pid and
node, how it ended (Ray's exit type and detail), the actor it ran, and whether the work went on
without it (Ray replaced it: the work finished) or ended with it."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import ray
from ray.util.state import list_tasks, list_workers

log = logging.getLogger(__name__)

# Ray's exit types of a worker that crashed or was killed by the system (the others: INTENDED_USER_EXIT,
# INTENDED_SYSTEM_EXIT: an idle worker retired, an actor killed by its owner; USER_ERROR: an actor's
# constructor raised, which reaches the driver as that exception).
UNEXPECTED_EXITS = ("SYSTEM_ERROR", "NODE_OUT_OF_MEMORY")
STATE_API_TIMEOUT_S = 10
DETAIL_CHARS = 200  # Ray's exit detail can run to a paragraph; the line keeps its start


@dataclass(frozen=True)
class WorkerDeath:
    """A worker process that ended unexpectedly: `ran` is the actor it ran ("RayTrainWorker") or the
    task it last ran ("task _pairs_task"), "" for one that died before it ran anything."""

    pid: int
    ip: str
    exit_type: str
    detail: str
    ran: str

    def line(self, went_on: bool) -> str:
        ran = f" running {self.ran}" if self.ran else ""
        detail = _first_sentences(self.detail)
        outcome = (
            "Ray started another worker in its place and the work went on" if went_on else "the work ended with it"
        )
        return f"a Ray worker process died: pid {self.pid} on {self.ip}{ran} ({self.exit_type}: {detail}); {outcome}"


def _first_sentences(text: str) -> str:
    """Ray's exit detail up to DETAIL_CHARS, cut after a sentence (it goes on to list common causes)."""
    text = " ".join(text.split())
    if len(text) <= DETAIL_CHARS:
        return text
    cut = text.rfind(". ", 0, DETAIL_CHARS)
    return text[: cut + 1] if cut > 0 else text[:DETAIL_CHARS] + "..."


def _what_it_ran(address: str, worker_id: str) -> str:
    """The actor class a worker process ran, else the last task it ran, else ""."""
    tasks = list_tasks(
        address, filters=[("worker_id", "=", worker_id)], detail=True, limit=1_000, timeout=STATE_API_TIMEOUT_S
    )
    # An actor task's function is "Class.method" whatever name it was given (Train names its own).
    actors = [t.func_or_class_name.split(".")[0] for t in tasks if t.actor_id and t.func_or_class_name]
    if actors:
        return actors[0]
    return f"task {tasks[-1].name}" if tasks else ""


def worker_deaths(since_s: float) -> list[WorkerDeath]:
    """The cluster's worker processes that ended unexpectedly since `since_s` (a time.time()), oldest
    first. Needs the state API (the dashboard); without it, none is found and that is logged at debug.
    The cluster is the one this process is connected to (named by its GCS address: with several Ray
    instances on a machine, Ray's own lookup finds the one started last)."""
    try:
        address = ray.get_runtime_context().gcs_address
        workers = list_workers(
            address,
            filters=[("is_alive", "=", "False")], detail=True, limit=10_000, timeout=STATE_API_TIMEOUT_S,
            raise_on_missing_output=False,
        )  # fmt: skip
        dead = [
            w
            for w in sorted(workers, key=lambda w: w.end_time_ms or 0)
            if w.worker_type == "WORKER" and w.exit_type in UNEXPECTED_EXITS and (w.end_time_ms or 0) >= since_s * 1000
        ]
        return [
            WorkerDeath(w.pid, w.ip, w.exit_type or "", w.exit_detail or "", _what_it_ran(address, w.worker_id))
            for w in dead
        ]
    except Exception as err:  # no dashboard, or it did not answer: the work's own outcome stands
        log.debug("worker deaths not checked: the state API did not answer (%s)", err)
        return []


OWNER_ENDED = "SIGTERM"  # Ray's exit detail of a worker the raylet ended because the task's owner ended


@contextlib.contextmanager
def reporting_worker_deaths(owned_tasks: Sequence[str] = ()) -> Iterator[None]:
    """Around a command's Ray work (a Train fit, a sweep, a distributed prepare): when it ends, a
    warning per worker process that died unexpectedly meanwhile, saying whether the work went on.
    `owned_tasks`: the names of tasks the work's own actors run and end by ending (the feed's
    pipeline tasks, whose dealer goes with a group that ends abruptly): Ray ends the workers running
    them with a SIGTERM, an exit it counts as unexpected; those are not said."""
    started = time.time()
    went_on = False
    ended_with_owner = {f"task {name}" for name in owned_tasks}
    try:
        yield
        went_on = True
    finally:
        for death in worker_deaths(started):
            if death.ran in ended_with_owner and OWNER_ENDED in death.detail:
                log.debug("%s (its owner ended it)", death.line(went_on))
                continue
            log.warning("%s", death.line(went_on))
