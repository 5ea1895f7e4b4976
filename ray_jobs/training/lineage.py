"""An --out folder's lineage: the chain of training runs into it, and what the next run into it is.

OUT/run.json (written whole, atomically) is the one record of the chain: every run into OUT since it
was last started over, oldest first, each with its MLflow run, the folder its checkpoints go to and
the step of its newest complete checkpoint as last seen. A folder is kept relative to OUT
(OUT/ray_results/...: a moved OUT still finds it, a copied OUT reads its own copy) or relative to
trainer.storage_path (<name>/<key> in a bucket, which the next run's config completes with whatever
credentials it carries; the record itself holds none); a folder that would lie outside them is
refused. What MLflow shows of the chain (the `convsts.continues` tag, the loss plot across runs) is
derived from it. A new run joins the chain before its first step, so a run killed before its first
checkpoint leaves every earlier link in place.

A run's start is checks -> decision -> actions. `decide_start` is the decision, and reads only:
start, continue checkpoint X (written by MLflow run R), or refuse in one line naming what it found;
every choice it makes that the user did not spell out is one line. `apply_start` carries it out once
every check has passed. `--resume latest` is the newest complete checkpoint by step across the
chain, OUT/checkpoint (a finished run's last) one candidate among them. The checkpoints of a run's
folder are listed by convsts.models.checkpoint (complete_checkpoints: step from the folder's name,
incomplete ones skipped with a line).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

from convsts.io import storage
from convsts.io.errors import ConfigError
from convsts.io.folders import removed_together
from convsts.io.redaction import redact
from convsts.models.checkpoint import (
    Checkpoint,
    complete_checkpoints,
    damaged_file,
    incomplete_reason,
    newest_complete,
)
from convsts.ray_jobs.config.schema import RESUME_LATEST, RunConfig
from convsts.ray_jobs.runtime.logs import log
from convsts.ray_jobs.runtime.run_folder import RunFolder
from convsts.ray_jobs.tracking import runs as tracking

RECORD_FORMAT = 3  # 3: checkpoints named checkpoint-<step>; a record of another format is refused
CONTINUES_TAG = "convsts.continues"
ENDED_BY_TAG = "convsts.ended_by"

# Where a link's folder is kept relative to
IN_OUT = "out"  # OUT itself
IN_STORAGE_PATH = "storage_path"  # trainer.storage_path


@dataclass(frozen=True)
class Link:
    """One run of OUT's chain."""

    run_id: str  # its MLflow run
    shown_as: str  # its checkpoint folder as people see it, redacted (run.json's "storage")
    base: str  # IN_OUT or IN_STORAGE_PATH: what `folder` is relative to
    folder: str  # relative, never leaving its base (read_chain refuses one that does)
    ray_train_run: str | None = None  # the id Ray Train gave its fit (its cluster reservation's name)

    def location(self, out_dir: Path, cfg: RunConfig) -> str | None:
        """The folder on this machine or at its URI, or None, said in one line, where this run
        cannot rebuild it (a folder under another trainer.storage_path than this run's)."""
        if self.base == IN_OUT:
            return str(out_dir / self.folder)
        if cfg.trainer.storage_path:
            here = storage.join(cfg.trainer.storage_path, self.folder)
            if redact(here) == self.shown_as:
                return here
        where = f"trainer.storage_path={redact(cfg.trainer.storage_path)}" if cfg.trainer.storage_path else "none"
        log.warning(
            "%s: run %s's checkpoints (%s) are not looked at: they are under another trainer.storage_path than "
            "this run's (%s)",
            RunFolder(out_dir).run_record,
            self.run_id,
            self.shown_as,
            where,
        )
        return None


class RunStorage(NamedTuple):
    """Where a run's checkpoints go: Ray Train's storage_path and the run's folder name there."""

    root: str
    name: str

    @property
    def uri(self) -> str:
        return storage.join(self.root, self.name)


class CheckpointCount(NamedTuple):
    """Complete checkpoints, and the highest step among them."""

    checkpoints: int
    newest_step: int | None


@dataclass(frozen=True)
class RunStart:
    """What a run into OUT is, decided once (decide_start) before any side effect."""

    resume_from: str  # the checkpoint it continues; "" starts from step 0 (or trainer.warm_start)
    continues: str | None  # the MLflow run that wrote that checkpoint
    storage: RunStorage  # where its own checkpoints go
    chain: tuple[Link, ...] = ()  # the runs before it, kept in run.json before its own link
    fresh_removes: tuple[Path, ...] = ()  # --fresh: OUT's earlier outputs, removed by `apply_start`
    fresh_counts: CheckpointCount | None = None  # --fresh: the complete checkpoints it removes

    def config(self, cfg: RunConfig) -> RunConfig:
        """The run config as this run trains it: trainer.resume_from the decided checkpoint."""
        return replace(cfg, trainer=replace(cfg.trainer, resume_from=self.resume_from))

    @property
    def chain_run_ids(self) -> tuple[str, ...]:
        """The MLflow runs of the chain before this run, oldest first, each once: every step they
        logged is not logged again."""
        return tuple(dict.fromkeys(k.run_id for k in self.chain))


class DamagedRecord(ConfigError):
    """OUT/run.json cannot be read."""


class AlreadyFinished(Exception):
    """--resume latest into an OUT whose newest checkpoint is at trainer.steps already: nothing to
    train (the command says so in one line and exits 0, without starting Ray)."""


def run_storage(cfg: RunConfig, out_dir: Path, key: str | None = None) -> RunStorage:
    """Where this run's checkpoints go.

    Every run owns its location. By default that is OUT/ray_results/<name> (<name>-<key> for a run
    that resumes another). An explicit trainer.storage_path (a bucket every node reaches) is shared
    by runs and sweeps, so the run's folder is <storage_path>/<name>/<key>: `key` a trial's own id
    (a sweep's rerun or retry finds that trial's checkpoints, and only those), else new for each run
    (a second run with the same name never restores the first's checkpoints). Ray Train's restarts
    within the run (node loss, trainer.max_failures) stay in it; OUT/run.json, train.json and the
    MLflow tag `convsts.storage` record it. decide_start calls it once per run (RunStart.storage)."""
    if not cfg.trainer.storage_path:
        if cfg.trainer.resume_from and key is None:
            key = new_run_key()  # a folder of its own: Ray Train would restore the resumed run's own checkpoint
        return RunStorage(str(RunFolder(out_dir).ray_results), cfg.name if key is None else f"{cfg.name}-{key}")
    return RunStorage(storage.join(cfg.trainer.storage_path, cfg.name), key or new_run_key())


def new_run_key() -> str:
    """A run's own folder name under a shared storage path: UTC start time and 6 random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def new_link(out_dir: Path, run_id: str, cfg: RunConfig, location: RunStorage) -> Link:
    """The link of a run whose checkpoints go to `location` (run_storage)."""
    where = location.uri
    if cfg.trainer.storage_path:
        return Link(run_id, redact(where), IN_STORAGE_PATH, storage.join(cfg.name, location.name))
    return Link(run_id, redact(where), IN_OUT, str(Path(where).relative_to(out_dir)))


# ---------------------------------------------------------------------------------------------
# run.json


def read_chain(out_dir: Path) -> list[Link]:
    """OUT's chain, oldest first; [] when OUT has no run.json. DamagedRecord (one line naming the
    file and the ways on) when it cannot be read, is of another format, or names a folder outside
    OUT or trainer.storage_path."""
    path = RunFolder(out_dir).run_record
    if not path.is_file():
        return []
    try:
        return _links(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DamagedRecord(
            f"{path}: not a run record this version reads ({reason}): its runs' checkpoints cannot be found from "
            f"it; pass --resume CHECKPOINT to continue one, or --fresh to start over"
        ) from None


def _links(record: Any) -> list[Link]:
    if not isinstance(record, dict):
        raise TypeError(f"expected a JSON object, got {type(record).__name__}")
    if record.get("format") != RECORD_FORMAT:
        raise ValueError(f"format {record.get('format')!r}, expected {RECORD_FORMAT}")
    runs = record["runs"]
    if not isinstance(runs, list) or not runs:
        raise ValueError("no runs")
    links = []
    for i, entry in enumerate(runs):
        fit = entry.get("ray_train_run")  # a record's "checkpoint_step" (written before) is left unread
        link = Link(entry["run_id"], entry["storage"], entry["base"], entry["folder"], fit)
        if not all(isinstance(v, str) and v for v in (link.run_id, link.shown_as, link.folder)):
            raise ValueError(f"runs[{i}]: run_id, storage and folder are non-empty strings")
        if not (fit is None or (isinstance(fit, str) and fit)):
            raise ValueError(f"runs[{i}]: ray_train_run {fit!r} is not a Ray Train run id")
        if link.base not in (IN_OUT, IN_STORAGE_PATH):
            raise ValueError(f"runs[{i}]: base {link.base!r} is not one this version writes")
        folder = PurePosixPath(link.folder)
        if storage.is_uri(link.folder) or folder.is_absolute() or ".." in folder.parts:
            base = "OUT" if link.base == IN_OUT else "trainer.storage_path"
            raise ValueError(f"runs[{i}].folder {link.folder!r} lies outside {base}")
        links.append(link)
    return links


def write_chain(out_dir: Path, links: list[Link] | tuple[Link, ...]) -> None:
    """OUT/run.json with `links`, written whole (a run killed while writing it leaves the old one)."""
    runs = [
        {
            "run_id": k.run_id,
            "storage": k.shown_as,
            "base": k.base,
            "folder": k.folder,
            "ray_train_run": k.ray_train_run,
        }
        for k in links
    ]
    storage.write_text(
        RunFolder(out_dir).run_record, json.dumps({"format": RECORD_FORMAT, "runs": runs}, indent=1) + "\n"
    )


def join_chain(out_dir: Path, start: RunStart, link: Link) -> None:
    """Before the run's first step: the chain it continues, then its own link (a run again, as a
    sweep's trial is, keeps its one link)."""
    write_chain(out_dir, [k for k in start.chain if k.run_id != link.run_id] + [link])


def mark_link(out_dir: Path, run_id: str, **fields: Any) -> None:
    """The run's link in OUT/run.json with `fields` changed: the id Ray Train gave its fit once the
    trainer is made (`ray_train_run`: a later run into OUT releases that fit's cluster reservation,
    dead_train_runs)."""
    links = read_chain(out_dir)
    write_chain(out_dir, [replace(k, **fields) if k.run_id == run_id else k for k in links])


def chain_runs(out_dir: Path, run_id: str) -> list[str]:
    """The MLflow runs of OUT's chain up to and including `run_id`, oldest first, each once: the
    runs whose logged metrics make up this run's curves."""
    runs = list(dict.fromkeys(k.run_id for k in _readable_chain(out_dir)))
    return runs[: runs.index(run_id) + 1] if run_id in runs else [*runs, run_id]


# ---------------------------------------------------------------------------------------------
# Checkpoints of the chain


def chain_checkpoints(out_dir: Path, cfg: RunConfig, links: list[Link]) -> list[Checkpoint]:
    """The newest complete checkpoint of each run of the chain and OUT/checkpoint, oldest step first."""
    found = []
    for link in links:
        folder = link.location(out_dir, cfg)
        newest = newest_complete(folder) if folder else None
        if newest is not None:
            found.append(newest.with_run(Checkpoint.at(newest.path).run_id))  # as its own record names it
    final = RunFolder(out_dir).final_checkpoint
    if final.is_dir():
        reason = incomplete_reason(final)
        if reason is None:
            found.append(Checkpoint.at(final))
        else:
            log.warning("%s: skipped, not a complete checkpoint (%s)", final, reason)
    # By step (a stable sort): at a tie OUT/checkpoint (local, last in the list) comes last, the one resumed.
    return sorted(found, key=lambda f: f.step)


def _count_local(out_dir: Path) -> CheckpointCount:
    """What --fresh removes of OUT's complete checkpoints (OUT's final and best checkpoints, and
    every run folder in OUT/ray_results, recorded or not)."""
    paths = [p for p in (RunFolder(out_dir).final_checkpoint, RunFolder(out_dir).best_checkpoint) if p.is_dir()]
    steps = [Checkpoint.at(p).step for p in paths if incomplete_reason(p) is None]
    local = RunFolder(out_dir).ray_results
    for run in sorted(local.iterdir()) if local.is_dir() else []:
        steps += [c.step for c in complete_checkpoints(str(run))]
    return CheckpointCount(len(steps), max(steps, default=None))


# ---------------------------------------------------------------------------------------------
# The decision


def decide_start(out_dir: Path, cfg: RunConfig, fresh: bool = False, storage_key: str | None = None) -> RunStart:
    """What a run into OUT is: a fresh start, or the checkpoint it continues (and whose run that
    is); refused in one line (FileExistsError, ConfigError, BadInputError) naming what OUT holds.
    Nothing is written or removed here, and no folder is read that the decision does not need."""
    asked = cfg.trainer.resume_from
    if fresh and asked:
        raise ConfigError(f"--fresh starts over and --resume {redact(asked)} continues a checkpoint: pass one of them")
    if storage_key:  # a sweep's trial, run again: the newest complete checkpoint of its own folder
        location = run_storage(cfg, out_dir, storage_key)
        own = None if asked else newest_complete(location.uri)
        # fresh: the trial's earlier outputs in OUT go (they are its own restart's), its checkpoints stay
        cleared = _fresh(out_dir, location) if fresh else RunStart("", None, location)
        chain = tuple(_readable_chain(out_dir))
        if own is not None:
            log.info("continuing from %s, the newest complete checkpoint of this run", redact(own.path))
            return replace(cleared, resume_from=own.path, continues=Checkpoint.at(own.path).run_id, chain=chain)
        continues = Checkpoint.at(asked).run_id if asked else None
        return replace(cleared, resume_from=asked, continues=continues, chain=chain)
    if fresh:
        return _fresh(out_dir, run_storage(cfg, out_dir))
    try:
        links = read_chain(out_dir)
    except DamagedRecord as damaged:
        if asked == RESUME_LATEST or not asked:
            raise
        log.warning("%s; continuing %s in a new chain", damaged, redact(asked))
        links = []
    if asked and asked != RESUME_LATEST:  # the checkpoint named: no link's folder is read
        return RunStart(asked, Checkpoint.at(asked).run_id, run_storage(cfg, out_dir), tuple(links))
    found = chain_checkpoints(out_dir, cfg, links)
    if asked == RESUME_LATEST:
        return _latest(out_dir, cfg, found, links)
    used = RunFolder(out_dir).run_outputs()
    if not (used or found or links):
        return RunStart("", None, run_storage(cfg, out_dir))
    bucket_folders = [k.shown_as for k in links if k.base != IN_OUT]
    what = ", ".join([p.name for p in used] + [f"checkpoints in {where}" for where in bucket_folders])
    stopped = "a training run" if (RunFolder(out_dir).train_summary).exists() else "an interrupted training run"
    if found:
        newest = found[-1]
        advice = (
            f"its newest complete checkpoint is {redact(newest.path)} (step {newest.step}); "
            f"pass --resume {RESUME_LATEST} to continue it,"
        )
    else:
        advice = "it left no complete checkpoint to resume:"
    raise FileExistsError(
        f"{out_dir} already holds {stopped} ({what}): {advice} --fresh to start over, or another --out"
    )


def _latest(out_dir: Path, cfg: RunConfig, found: list[Checkpoint], links: list[Link]) -> RunStart:
    """--resume latest: the newest complete checkpoint by step across the chain, said in one line,
    with a second where it is not the last run's own newest (a fallback to an earlier run's)."""
    if not found:
        raise ConfigError(
            f"--resume {RESUME_LATEST}: {out_dir} records no run with a complete checkpoint"
            + (f" (looked in {', '.join(k.shown_as for k in links)})" if links else "")
            + "; pass --resume CHECKPOINT, or train without --resume"
        )
    newest = found[-1]
    if newest.step >= cfg.trainer.steps:
        raise AlreadyFinished(
            f"{out_dir}: already finished at step {newest.step} ({redact(newest.path)}); raise trainer.steps to go on"
        )
    usable = _undamaged_newest(list(found))
    if usable is None:
        raise ConfigError(
            f"--resume {RESUME_LATEST}: every complete checkpoint {out_dir} records is damaged (said above); "
            "pass --resume CHECKPOINT, or --fresh to start over"
        )
    log.info("--resume %s: %s (step %d)", RESUME_LATEST, redact(usable.path), usable.step)
    last = links[-1] if links else None
    if last is not None and usable.run_id != last.run_id and Path(usable.path) != RunFolder(out_dir).final_checkpoint:
        log.warning(
            "--resume %s: the last run into %s (%s) left no newer complete checkpoint; continuing run %s's at step %d",
            RESUME_LATEST,
            out_dir,
            last.run_id,
            usable.run_id,
            usable.step,
        )
    return RunStart(usable.path, usable.run_id, run_storage(cfg, out_dir), tuple(links))


def _undamaged_newest(found: list[Checkpoint]) -> Checkpoint | None:
    """The newest of `found` (oldest step first) whose files have their manifest's sha256: a damaged
    one is skipped in one line, as one cut short is, and its run's next older complete checkpoint
    takes its place among the candidates."""
    while found:
        newest = found.pop()
        damaged = damaged_file(newest.path)
        if damaged is None:
            return newest
        log.warning(
            "%s: skipped, its %s differs from its manifest's sha256 (replaced or damaged after it was written)",
            redact(newest.path),
            damaged,
        )
        older = _older_complete(newest)
        if older is not None:
            found = sorted([*found, older], key=lambda f: f.step)
    return None


def _older_complete(newest: Checkpoint) -> Checkpoint | None:
    """The newest complete checkpoint of `newest`'s run folder below its step (each incomplete one met
    on the way skipped in one line), or None."""
    older = complete_checkpoints(newest.folder, newest_only=True, below=newest.step) if newest.folder else []
    return older[0].with_run(Checkpoint.at(older[0].path).run_id) if older else None


def _fresh(out_dir: Path, location: RunStorage) -> RunStart:
    """--fresh: OUT's earlier outputs, to be removed by `apply_start`, counted now (no link is read)."""
    return RunStart("", None, location, (), tuple(RunFolder(out_dir).run_outputs()), _count_local(out_dir))


def _readable_chain(out_dir: Path) -> list[Link]:
    try:
        return read_chain(out_dir)
    except DamagedRecord:
        return []


# ---------------------------------------------------------------------------------------------
# The actions, once every check has passed


def apply_start(out_dir: Path, start: RunStart, tracking_uri: str, own_run: str | None, config_yaml: str) -> None:
    """What a decided run does to OUT and MLflow before its MLflow run starts: the runs of OUT's
    chain (and of the checkpoint it continues, where that is in OUT) that a killed process left
    RUNNING end KILLED, --fresh removes OUT's earlier outputs, OUT/config.yaml is the config as run."""
    runs = [k.run_id for k in _readable_chain(out_dir)] + list(start.chain_run_ids)
    if start.continues and not storage.is_uri(start.resume_from) and Path(start.resume_from).is_relative_to(out_dir):
        runs.append(start.continues)  # OUT's lock is ours: nobody logs there
    close_abandoned_runs(out_dir, tracking_uri, own_run, runs)
    remove_earlier_outputs(start)
    storage.write_text(RunFolder(out_dir).config, config_yaml)


def remove_earlier_outputs(start: RunStart) -> None:
    """--fresh: OUT's earlier outputs removed, saying how many complete checkpoints (up to which
    step) go; a run's own folder in a bucket stays."""
    if not start.fresh_removes or start.fresh_counts is None:
        return
    links = {path: path.resolve() for path in start.fresh_removes if path.is_symlink()}
    removed_together(list(start.fresh_removes))  # all or none
    for link, target in links.items():
        log.info("--fresh: %s was a link: the link removed, the folder it points to kept (%s)", link, target)
    counted = start.fresh_counts
    upto = f", up to step {counted.newest_step}" if counted.newest_step is not None else ""
    removed = ", ".join(str(p) for p in start.fresh_removes)
    log.info("--fresh: removed %d complete checkpoint(s)%s: %s", counted.checkpoints, upto, removed)


SUPERSEDED_TAG = "convsts.superseded_after_step"  # on a run whose later steps a resume with other settings replaced


def mark_superseded(tracking_uri: str, run_id: str, start: RunStart, step: int) -> list[str]:
    """The runs of the chain (and the run the checkpoint came from) that logged steps after `step`,
    tagged as superseded after it by `run_id` (a resume of the checkpoint of `step` with a new
    trajectory: it logs those steps itself); their ids."""
    superseded = []
    for earlier in dict.fromkeys([start.continues, *start.chain_run_ids]):
        if earlier and earlier != run_id and tracking.run_status(tracking_uri, earlier):
            if max(tracking.last_logged_steps(tracking_uri, earlier).values(), default=-1) > step:
                tracking.set_tags(tracking_uri, earlier, {SUPERSEDED_TAG: str(step), "convsts.superseded_by": run_id})
                superseded.append(earlier)
    return superseded


def close_abandoned_runs(out_dir: Path, tracking_uri: str, own_run: str | None, runs: Sequence[str]) -> None:
    """Each of `runs` (the chain's, and the run of the checkpoint continued) still RUNNING in MLflow
    ended without closing it (killed: this process holds OUT's lock), so it ends KILLED, saying why,
    unless it is `own_run` (a sweep's trial run again logs to its own run)."""
    for run_id in dict.fromkeys(runs):
        if run_id == own_run or tracking.run_status(tracking_uri, run_id) != "RUNNING":
            continue
        tracking.set_tags(
            tracking_uri,
            run_id,
            {ENDED_BY_TAG: f"its process ended with the run open; found by the next run into {out_dir}"},
        )
        tracking.end_run(tracking_uri, run_id, "KILLED")
        log.info(
            "MLflow run %s of an earlier run into %s was left RUNNING (its process was killed): now KILLED",
            run_id,
            out_dir,
        )
