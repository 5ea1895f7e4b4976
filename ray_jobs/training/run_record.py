"""An --out folder's chain of training runs, and what the next run into it is.

OUT/run.json (written whole, atomically) keeps the chain: every run into OUT since it was last
started over, each with its MLflow run and the folder its checkpoints go to, and the step of its
newest complete checkpoint as last seen. A folder is kept relative to OUT (OUT/ray_results/...: a
moved OUT still finds it, a copied OUT reads its own copy) or relative to trainer.storage_path
(<name>/<key> in a bucket, which the next run's config completes with whatever credentials it
carries; the record itself holds none). A new run joins the chain before its first step, so a run
killed before its first checkpoint leaves every earlier link in place.

`decide_start` makes the one decision, before any side effect: start, continue checkpoint X (written
by MLflow run R), or refuse in one line naming what it found. `--resume latest` is the newest
complete checkpoint by step across the chain, OUT/checkpoint (a finished run's last) one candidate
among them. A checkpoint is complete when its manifest, written last, and every file it lists are
there (models.checkpoint_files.incomplete_reason): the newest folder of a run killed during an upload is
skipped, not resumed. A run.json that cannot be read is refused, naming it, never ignored.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from convsts.io import storage
from convsts.io.errors import BadInputError, ConfigError
from convsts.io.redaction import REDACTED, redact
from convsts.models.checkpoint_files import incomplete_reason
from convsts.ray_jobs.config.schema import RESUME_LATEST, RunConfig
from convsts.ray_jobs.runtime.process import log
from convsts.ray_jobs.tracking import runs as tracking

RUN_RECORD = "run.json"
RECORD_FORMAT = 2
CONTINUES_TAG = "convsts.continues"
ENDED_BY_TAG = "convsts.ended_by"
FINAL_CHECKPOINT = "checkpoint"  # OUT/checkpoint: a finished run's last checkpoint
MODEL_FOLDER = "model"  # OUT/model
BEST_FOLDER = "best_checkpoint"  # OUT/best_checkpoint: the best in-training STS-B dev (trainer.eval_every)
TRAIN_SUMMARY = "train.json"  # OUT/train.json: written when a run finishes
LOCAL_RESULTS = "ray_results"  # OUT/ray_results: Ray Train's run folders without a trainer.storage_path
# Ray Train's checkpoint folders, named by the time they were reported (not its checkpoint_manager_snapshot.json)
CHECKPOINT_NAME = re.compile(r"checkpoint_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\.\d+")

# Where a link's folder is kept relative to
IN_OUT = "out"  # OUT itself
IN_STORAGE_PATH = "storage_path"  # trainer.storage_path


@dataclass(frozen=True)
class Link:
    """One run of OUT's chain."""

    run_id: str  # its MLflow run
    storage: str  # its checkpoint folder, redacted: for people
    base: str  # IN_OUT or IN_STORAGE_PATH: what `folder` is relative to
    folder: str
    checkpoint_step: int | None = None  # its newest complete checkpoint's step, as last seen

    def location(self, out_dir: Path, cfg: RunConfig) -> str | None:
        """The folder on this machine or at its URI, or None where it cannot be rebuilt (a bucket
        named without the credentials this run's trainer.storage_path would give it)."""
        if self.base == IN_OUT:
            return str(out_dir / self.folder)
        if cfg.trainer.storage_path:
            here = storage.join(cfg.trainer.storage_path, self.folder)
            if redact(here) == self.storage:
                return here
        return self.storage if REDACTED not in self.storage else None


@dataclass(frozen=True)
class Found:
    """A complete checkpoint of the chain."""

    path: str
    step: int
    run_id: str | None  # the MLflow run that wrote it


@dataclass(frozen=True)
class RunStart:
    """What a run into OUT is, decided once (decide_start) before any side effect."""

    resume_from: str  # the checkpoint it continues; "" starts from step 0 (or trainer.warm_start)
    continues: str | None  # the MLflow run that wrote that checkpoint
    chain: tuple[Link, ...] = ()  # the runs before it, kept in run.json before its own link
    fresh_removes: list[Path] = field(default_factory=list)  # --fresh: OUT's earlier outputs, removed by `claim`

    def config(self, cfg: RunConfig) -> RunConfig:
        """The run config as this run trains it: trainer.resume_from the decided checkpoint."""
        return replace(cfg, trainer=replace(cfg.trainer, resume_from=self.resume_from))


class DamagedRecord(ConfigError):
    """OUT/run.json cannot be read."""


class RunStorage(NamedTuple):
    """Where a run's checkpoints go: Ray Train's storage_path and the run's folder name there."""

    root: str
    name: str

    @property
    def uri(self) -> str:
        return storage.join(self.root, self.name)


def run_storage(cfg: RunConfig, out_dir: Path, key: str | None = None) -> RunStorage:
    """Where this run's checkpoints go.

    Every run owns its location. By default that is OUT/ray_results/<name> (<name>-<key> for a run
    that resumes another). An explicit trainer.storage_path (a bucket every node reaches) is shared
    by runs and sweeps, so the run's folder is <storage_path>/<name>/<key>: `key` a trial's own id
    (a sweep's rerun or retry finds that trial's checkpoints, and only those), else new for each run
    (a second run with the same name never restores the first's checkpoints). Ray Train's restarts
    within the run (node loss, trainer.max_failures) stay in it; OUT/run.json, train.json and the
    MLflow tag `convsts.storage` record it."""
    if not cfg.trainer.storage_path:
        if cfg.trainer.resume_from and key is None:
            key = new_run_key()  # a folder of its own: Ray Train would restore the resumed run's own checkpoint
        return RunStorage(str(out_dir / LOCAL_RESULTS), cfg.name if key is None else f"{cfg.name}-{key}")
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
    file and the ways on) when it cannot be read."""
    path = out_dir / RUN_RECORD
    if not path.is_file():
        return []
    try:
        return _links(json.loads(path.read_text(encoding="utf-8")), out_dir)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DamagedRecord(
            f"{path}: not a convsts run record ({reason}): its runs' checkpoints cannot be found from it; "
            f"pass --resume CHECKPOINT to continue one, or --fresh to start over"
        ) from None


def _links(record: Any, out_dir: Path) -> list[Link]:
    if not isinstance(record, dict):
        raise TypeError(f"expected a JSON object, got {type(record).__name__}")
    if "format" not in record and isinstance(record.get("run_id"), str):  # one run, absolute folder
        return [_absolute_link(record, out_dir)]
    if record.get("format") != RECORD_FORMAT:
        raise ValueError(f"format {record.get('format')!r}, expected {RECORD_FORMAT}")
    runs = record["runs"]
    if not isinstance(runs, list) or not runs:
        raise ValueError("no runs")
    links = []
    for i, entry in enumerate(runs):
        step = entry.get("checkpoint_step")
        link = Link(entry["run_id"], entry["storage"], entry["base"], entry["folder"], step)
        if not all(isinstance(v, str) and v for v in (link.run_id, link.storage, link.folder)):
            raise ValueError(f"runs[{i}]: run_id, storage and folder are non-empty strings")
        if link.base not in (IN_OUT, IN_STORAGE_PATH) or not (step is None or isinstance(step, int)):
            raise ValueError(
                f"runs[{i}]: base {link.base!r} or checkpoint_step {step!r} is not one this version writes"
            )
        links.append(link)
    return links


def _absolute_link(record: dict[str, Any], out_dir: Path) -> Link:
    """A record of one run that names its folder absolutely (run.json before chains)."""
    where, key = record["storage"], record.get("storage_key")
    if not isinstance(where, str) or not where:
        raise ValueError("no storage")
    if isinstance(key, str) and key:
        name = where.rstrip("/").rsplit("/", 2)[-2]
        return Link(record["run_id"], where, IN_STORAGE_PATH, f"{name}/{key}")
    local = Path(where)
    if not storage.is_uri(where) and local.is_relative_to(out_dir):
        return Link(record["run_id"], where, IN_OUT, str(local.relative_to(out_dir)))
    return Link(record["run_id"], where, IN_STORAGE_PATH if storage.is_uri(where) else IN_OUT, where)


def write_chain(out_dir: Path, links: list[Link] | tuple[Link, ...]) -> None:
    """OUT/run.json with `links`, written whole (a run killed while writing it leaves the old one)."""
    runs = [
        {
            "run_id": k.run_id,
            "storage": k.storage,
            "base": k.base,
            "folder": k.folder,
            "checkpoint_step": k.checkpoint_step,
        }
        for k in links
    ]
    storage.write_text(out_dir / RUN_RECORD, json.dumps({"format": RECORD_FORMAT, "runs": runs}, indent=1) + "\n")


def join_chain(out_dir: Path, start: RunStart, link: Link) -> None:
    """Before the run's first step: the chain it continues, then its own link (a run again, as a
    sweep's trial is, keeps its one link)."""
    write_chain(out_dir, [k for k in start.chain if k.run_id != link.run_id] + [link])


def mark_checkpoint(out_dir: Path, run_id: str, step: int) -> None:
    """The run's link records `step` as its newest complete checkpoint (a finished run's last)."""
    links = read_chain(out_dir)
    write_chain(out_dir, [replace(k, checkpoint_step=step) if k.run_id == run_id else k for k in links])


# ---------------------------------------------------------------------------------------------
# Checkpoints


def checkpoint_owner(path: str) -> tuple[int, str | None]:
    """(step, the MLflow run that wrote it) from a checkpoint's config.json: one small read, local
    or at a URI."""
    meta = json.loads(storage.read_text(storage.join(path, "config.json")))
    return int(meta.get("step", 0)), (meta.get("provenance") or {}).get("run_id")


def complete_checkpoints(folder: str) -> list[str]:
    """Ray Train's complete checkpoint_* folders in `folder` (local or a URI), newest first;
    incomplete ones (an upload that stopped midway) are left out, and logged."""
    try:
        names = [n for n in storage.entry_names(folder) if CHECKPOINT_NAME.fullmatch(n)]
    except FileNotFoundError:
        return []
    kept = []
    for name in sorted(names, reverse=True):  # the names sort by time
        candidate = storage.join(folder, name)
        reason = incomplete_reason(candidate)
        if reason is None:
            kept.append(candidate)
        else:
            log.warning("%s: skipped, not a complete checkpoint (%s)", redact(candidate), reason)
    return kept


def newest_complete(folder: str, run_id: str | None = None) -> Found | None:
    """The newest complete checkpoint in `folder`, or None."""
    for path in complete_checkpoints(folder):
        try:
            step, owner = checkpoint_owner(path)
        except (OSError, ValueError, TypeError, AttributeError) as err:
            log.warning("%s: skipped, its config.json is not readable (%s)", redact(path), err)
            continue
        return Found(path, step, owner or run_id)
    return None


def chain_checkpoints(out_dir: Path, cfg: RunConfig, links: list[Link]) -> tuple[list[Found], list[Link]]:
    """(the newest complete checkpoint of each run of the chain and OUT/checkpoint, oldest step
    first; the links with the steps seen)."""
    found, seen = [], []
    for link in links:
        folder = link.location(out_dir, cfg)
        newest = newest_complete(folder, link.run_id) if folder else None
        if newest is not None:
            found.append(newest)
        seen.append(replace(link, checkpoint_step=newest.step if newest else link.checkpoint_step))
    final = out_dir / FINAL_CHECKPOINT
    if final.is_dir() and incomplete_reason(final) is None:
        step, owner = checkpoint_owner(str(final))
        found.append(Found(str(final), step, owner or _finished_run(out_dir)))
    # By step (a stable sort): at a tie OUT/checkpoint (local, last in the list) comes last, the one resumed.
    return sorted(found, key=lambda f: f.step), seen


def _finished_run(out_dir: Path) -> str | None:
    """The MLflow run of OUT's finished run (train.json), for a checkpoint that does not name it."""
    try:
        return json.loads((out_dir / TRAIN_SUMMARY).read_text(encoding="utf-8")).get("mlflow_run_id")
    except (OSError, ValueError, AttributeError):
        return None


def _count_local(out_dir: Path) -> tuple[int, int | None]:
    """(complete checkpoints in OUT, the highest step among them): what --fresh removes (OUT's final
    and best checkpoints, and every run folder in OUT/ray_results, recorded or not)."""
    paths = [str(out_dir / n) for n in (FINAL_CHECKPOINT, BEST_FOLDER) if (out_dir / n).is_dir()]
    paths = [p for p in paths if incomplete_reason(p) is None]
    local = out_dir / LOCAL_RESULTS
    for run in sorted(local.iterdir()) if local.is_dir() else []:
        paths += complete_checkpoints(str(run))
    steps = [checkpoint_owner(p)[0] for p in paths]
    return len(paths), max(steps, default=None)


# ---------------------------------------------------------------------------------------------
# The decision


def run_outputs(out_dir: Path) -> list[Path]:
    """What earlier training runs left in out_dir: their record, train.json, checkpoints and model
    folder, Ray Train's own run folders (when they are local)."""
    candidates = [out_dir / n for n in (RUN_RECORD, TRAIN_SUMMARY, FINAL_CHECKPOINT, MODEL_FOLDER, BEST_FOLDER)]
    candidates.append(out_dir / LOCAL_RESULTS)
    return [p for p in candidates if p.exists()]


def decide_start(out_dir: Path, cfg: RunConfig, fresh: bool = False, storage_key: str | None = None) -> RunStart:
    """What a run into OUT is: a fresh start, or the checkpoint it continues (and whose run that
    is); refused in one line (FileExistsError, ConfigError) naming what OUT holds. Nothing is
    written or removed here."""
    asked = cfg.trainer.resume_from
    if storage_key:  # a sweep's trial, run again: the newest complete checkpoint of its own folder
        removes = run_outputs(out_dir) if fresh else []
        own = None if asked else newest_complete(run_storage(cfg, out_dir, storage_key).uri)
        if own is not None:
            log.info("continuing from %s, the newest complete checkpoint of this run", redact(own.path))
            return RunStart(own.path, own.run_id, tuple(_readable_chain(out_dir)), removes)
        return RunStart(asked, _owner(asked) if asked else None, (), removes)
    try:
        links = read_chain(out_dir)
    except DamagedRecord as damaged:
        if asked == RESUME_LATEST or not (fresh or asked):
            raise
        log.warning("%s; %s", damaged, "started over (--fresh)" if fresh else f"continuing {redact(asked)}")
        links = []
    found, links = chain_checkpoints(out_dir, cfg, links)
    if asked == RESUME_LATEST:
        if not found:
            raise ConfigError(
                f"--resume {RESUME_LATEST}: {out_dir} records no run with a complete checkpoint"
                + (f" (looked in {', '.join(k.storage for k in links)})" if links else "")
                + "; pass --resume CHECKPOINT, or train without --resume"
            )
        newest = found[-1]
        log.info("--resume %s: %s (step %d)", RESUME_LATEST, redact(newest.path), newest.step)
        return RunStart(newest.path, newest.run_id, tuple(links))
    if asked:
        known = {f.path: f.run_id for f in found}
        return RunStart(asked, known.get(asked) or _owner(asked), tuple(links))
    used = run_outputs(out_dir)
    bucket_folders = [k.storage for k in links if k.base != IN_OUT]
    if not (used or found or links):
        return RunStart("", None)
    if not fresh:
        what = ", ".join([p.name for p in used] + [f"checkpoints in {where}" for where in bucket_folders])
        stopped = "a training run" if (out_dir / TRAIN_SUMMARY).exists() else "an interrupted training run"
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
    return RunStart("", None, (), used)


def _readable_chain(out_dir: Path) -> list[Link]:
    try:
        return read_chain(out_dir)
    except DamagedRecord:
        return []


def _owner(checkpoint: str) -> str | None:
    """The MLflow run that wrote a checkpoint a user names, or None (not readable here: the run's
    checks say why, in one line)."""
    try:
        return checkpoint_owner(checkpoint)[1]
    except (OSError, ValueError, TypeError, AttributeError, BadInputError):
        return None


def claim(out_dir: Path, start: RunStart) -> None:
    """--fresh: OUT's earlier outputs removed, saying how many complete checkpoints (up to which
    step) go; a run's own folder in a bucket stays."""
    if not start.fresh_removes:
        return
    links = _readable_chain(out_dir)
    count, step = _count_local(out_dir)
    for path in start.fresh_removes:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    upto = f", up to step {step}" if step is not None else ""
    log.info(
        "--fresh: removed %d complete checkpoint(s)%s: %s",
        count,
        upto,
        ", ".join(str(p) for p in start.fresh_removes),
    )
    for link in links:
        if link.base != IN_OUT:
            log.info("--fresh: the earlier run's own checkpoints stay in %s", link.storage)


def close_abandoned_runs(
    out_dir: Path, tracking_uri: str, own_run: str | None = None, runs: Sequence[str] | None = None
) -> None:
    """Every run of OUT's chain (or `runs`: the run of a checkpoint in OUT that a run continues)
    still RUNNING in MLflow ended without closing it (killed: this process holds OUT's lock), so it
    ends KILLED, saying why, unless it is `own_run` (a sweep's trial run again logs to its own run)."""
    for run_id in [k.run_id for k in _readable_chain(out_dir)] if runs is None else runs:
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
