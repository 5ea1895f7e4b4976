"""A task's prepared folder: its manifest (every shard with its row count, the settings and raw
inputs it was prepared from), written last by `prepare` and verified before a run reads the folder;
resuming an interrupted prepare. The task declares what it prepares (ray_jobs/tasks/); this module
keeps the folder honest."""

from __future__ import annotations

import contextlib
import datetime
import json
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from convsts.datasets.shards import ShardRecord, write_frame
from convsts.io import redaction, storage, tables
from convsts.io.dotted import changed_values, flatten
from convsts.io.errors import BadInputError
from convsts.io.redaction import redact_tree
from convsts.ray_jobs.runtime.logs import log
from convsts.ray_jobs.runtime.output_lock import LOCK_FILE, output_lock

if TYPE_CHECKING:
    from convsts.ray_jobs.config.schema import RunConfig
    from convsts.ray_jobs.tasks.base import Task


MANIFEST = "manifest.json"
PREPARE_MARKER = ".convsts-prepare"  # written before a prepare's first shard, removed after its manifest


def config_value(config: dict[str, Any], dotted: str) -> Any:
    """config["a"]["b"] for "a.b"; None where a part is missing."""
    value: Any = config
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def input_record(files: Sequence[str], digests: bool = False) -> list[dict[str, Any]]:
    """[{file (credentials redacted), size, mtime_ns}] of raw input files, as a manifest records them.
    With `digests`, a local file's sha256 too (the file read once more, at the end of prepare), so
    that the same bytes copied anew to the same place (a new modification time) are recognised;
    files at URIs record none."""
    record = []
    for file in files:
        found = storage.file_stat(file)
        if found is None:
            raise FileNotFoundError(f"input not found: {redaction.redact(file)}")
        entry = {"file": redaction.redact(file), "size": found[0], "mtime_ns": found[1]}
        if digests and not storage.is_uri(file):
            entry["sha256"] = storage.file_sha256(file)
        record.append(entry)
    return record


def _names(files: Sequence[str], shown: int = 3) -> str:
    return ", ".join(files[:shown]) + (f", ... {len(files) - shown} more" if len(files) > shown else "")


def _when(mtime_ns: int) -> str:
    return datetime.datetime.fromtimestamp(mtime_ns / 1e9, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# The entries of a manifest's lists that the checks below read, and their types.
SHARD_ENTRY = {"file": str, "rows": int, "bytes": int, "sha256": str}


INPUT_ENTRY = {"file": str, "size": int, "mtime_ns": int}


def manifest_shape_problem(manifest: Any) -> str | None:
    """What makes a manifest unreadable to verify_prepared (a hand-edited or foreign file), as
    'KEY: what is wrong', or None: a JSON object whose `shards` maps splits to lists of
    {file, rows, bytes, sha256} and whose `input_files`, where present, is a list of {file, size, mtime_ns}
    (`shard_times`, where present, maps splits to {shard: int})."""
    if not isinstance(manifest, dict):
        return f"not a JSON object but {type(manifest).__name__}"
    if "shards" not in manifest:
        return "lists no shards"
    if not isinstance(manifest["shards"], dict):
        return "shards: not a mapping of splits to shard lists"
    times = manifest.get("shard_times", {})
    if not isinstance(times, dict) or not all(
        isinstance(t, dict) and all(type(v) is int for v in t.values()) for t in times.values()
    ):
        return "shard_times: not a mapping of splits to {shard: modification time in ns}"
    lists = [(f"shards.{split}", listed, SHARD_ENTRY) for split, listed in manifest["shards"].items()]
    if "input_files" in manifest:
        lists.append(("input_files", manifest["input_files"], INPUT_ENTRY))
    for key, entries, entry in lists:
        if not isinstance(entries, list):
            return f"{key}: not a list"
        for i, item in enumerate(entries):
            wrong = [
                f"no {kind.__name__} {name!r}"
                for name, kind in entry.items()
                if not isinstance(item, dict) or type(item.get(name)) is not kind
            ]
            if wrong:
                return f"{key}[{i}]: {', '.join(wrong)}"
    return None


def shard_files(split_dir: str) -> list[str]:
    return [f for f in storage.list_files(split_dir) if f.endswith(".parquet")] if storage.is_dir(split_dir) else []


def write_train_frame(frame, out_dir: str, rows_per_shard: int) -> list[ShardRecord]:
    """A pandas frame of training rows (already in the driver) -> parquet shards of `rows_per_shard`
    rows in out_dir/train, written from this process; their records."""
    return write_frame(frame, storage.join(out_dir, "train"), rows_per_shard)


def shard_record(path: str) -> ShardRecord:
    """A shard file's record as it is now (rows from its footer, its bytes read for the sha256), to
    compare with the one its manifest lists (written as the shard was)."""
    stat = storage.file_stat(path)
    return {
        "file": storage.name(path),
        "rows": tables.parquet_rows(path),
        "bytes": stat[0] if stat else 0,
        "sha256": storage.file_sha256(path),
    }


def listed_shards(folder: str, shards: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, tuple[int, int]]]:
    """{split: {file: (size, modification time in ns)}} of the parquet files the store lists in the
    folder of each split of `shards` (a manifest's), one listing a split."""
    found: dict[str, dict[str, tuple[int, int]]] = {}
    for split in shards:
        split_dir = storage.join(folder, split)
        stats = storage.folder_stats(split_dir) if storage.is_dir(split_dir) else []
        found[split] = {name: (size, mtime) for name, size, mtime in stats if name.endswith(".parquet")}
    return found


def shard_times(
    shards: dict[str, list[dict[str, Any]]], listed: dict[str, dict[str, tuple[int, int]]]
) -> dict[str, dict[str, int]]:
    """{split: {file: modification time in ns}} of the shards `listed` (listed_shards) at the size
    their records give: a manifest's `shard_times` when taken right after `prepare` wrote them. A
    later check takes a shard whose time is still the recorded one for that file, unread."""
    return {
        split: {
            s["file"]: listed[split][s["file"]][1]
            for s in records
            if listed[split].get(s["file"], (-1,))[0] == s["bytes"]
        }
        for split, records in shards.items()
    }


def as_written(manifest: dict[str, Any], listed: dict[str, dict[str, tuple[int, int]]]) -> dict[str, set[str]]:
    """{split: the shards `listed` (listed_shards) at their record's size and the time the manifest's
    `shard_times` recorded}: the files `prepare` wrote, taken unread."""
    recorded = manifest.get("shard_times", {})
    return {
        split: {file for file, t in now.items() if recorded.get(split, {}).get(file) == t}
        for split, now in shard_times(manifest["shards"], listed).items()
    }


def copy_prepared(source: str, target: str) -> None:
    """A prepared folder (a task's) copied file by file, its manifest's `shard_times` the copies'
    times of the shards `source` holds as written (as_written); the others' copies are read for
    their sha256 when checked, as the originals would be. A folder without a readable manifest is
    copied as it is."""
    storage.copy_tree(source, target)
    path = storage.join(target, MANIFEST)
    if not storage.is_file(path):
        return
    try:
        manifest = json.loads(storage.read_text(path))
    except ValueError:
        return
    if manifest_shape_problem(manifest):
        return
    shards = manifest["shards"]
    written, copies = (
        as_written(manifest, listed_shards(source, shards)),
        shard_times(shards, listed_shards(target, shards)),
    )
    times = {split: {file: t for file, t in copies[split].items() if file in written[split]} for split in shards}
    storage.write_text(path, json.dumps({**manifest, "shard_times": times}, indent=2))


def shard_problem(task: Task, path: str, listed: dict[str, Any]) -> str | None:
    """What differs between a shard and its manifest entry, or between its rows and what the task
    reads (its columns; labels of the task's classes), or None. The content is checked by its sha256:
    a shard replaced by other rows of the same count is refused before Ray starts."""
    now = shard_record(path)  # BadInputError for a corrupt footer, a truncated file
    if now["rows"] != listed["rows"]:
        return f"{now['rows']} rows, the manifest says {listed['rows']}"
    if now["bytes"] != listed["bytes"]:
        return f"{now['bytes']} bytes, the manifest says {listed['bytes']}: not the shard `prepare` wrote"
    if now["sha256"] != listed["sha256"]:
        return "its bytes differ from the shard `prepare` wrote (sha256)"
    names = tables.read_parquet_schema(path).names
    missing = [c for c in task.columns if c not in names]
    if missing:
        return f"no column(s) {missing}, which task {task.name} reads"
    if task.label and task.label_classes:
        labels = tables.read_parquet_table(path, columns=[task.label]).column(0).to_numpy()
        bad = (labels < 0) | (labels >= task.label_classes)
        if bad.any():
            row = int(bad.argmax())
            return (
                f"row {row}: {task.label} {labels[row]} is not a class of task {task.name} (0-{task.label_classes - 1})"
            )
    return None


def write_manifest(task: Task, out_dir: str, manifest: dict[str, Any], inputs: Sequence[str] = ()) -> dict[str, Any]:
    """The last step of `prepare`: the manifest, whose `shards` lists each split's shards as they
    were written (write_shards' records), is written after them, so a folder without one is an
    interrupted prepare. `inputs`, the raw files read, are recorded with their sizes, times and,
    for local files, sha256 (`input_files`; input_changes)."""
    if set(manifest.get("shards", ())) != set(task.splits):
        raise RuntimeError(
            f"{task.name}: the manifest lists shards of {sorted(manifest.get('shards', ()))}, not of {list(task.splits)}"
        )
    manifest = {**manifest, "shard_times": shard_times(manifest["shards"], listed_shards(out_dir, manifest["shards"]))}
    if inputs:
        manifest = {**manifest, "input_files": input_record(inputs, digests=True)}
    manifest = redact_tree(manifest)  # input URIs lose their credentials
    storage.write_text(storage.join(out_dir, MANIFEST), json.dumps(manifest, indent=2))
    return manifest


def settings_mismatches(
    task: Task,
    manifest: dict[str, Any],
    config: dict[str, Any],
    keys: tuple[str, ...] | None = None,
    label: str = "this run",
) -> list[str]:
    """'KEY=RECORDED (LABEL: VALUE)' for each of `keys` (default prepared_keys; a section such
    as `filters` key by key) whose value in the manifest differs from the run config's."""

    recorded: dict[str, Any] = {}
    current: dict[str, Any] = {}
    out = []
    for key in task.prepared_keys if keys is None else keys:
        parent, _, name = key.rpartition(".")
        prefix = f"{parent}." if parent else ""
        if name not in manifest:
            out.append(f"{key} (not recorded in its manifest)")
            continue
        recorded.update(flatten({name: manifest[name]}, prefix))
        current.update(flatten({name: config_value(config, key)}, prefix))
    return out + changed_values(recorded, current, label)


def input_changes(task: Task, manifest: dict[str, Any], cfg: RunConfig) -> list[str]:
    """How this run's raw inputs (raw_inputs, expanded) differ from those the folder was prepared
    from: a file at the same place whose size or modification time changed since (unless its
    bytes are the ones prepared: a local file with the same size and the recorded sha256, as
    after copying the data anew), or other files (by name and size: the same files copied
    elsewhere, as into a submitted job's working folder, are the same inputs, and a local copy
    must also hold the recorded sha256 where the manifest has one). Not compared when the
    manifest predates the record, or when this run's inputs are not on this machine (a folder
    prepared elsewhere, e.g. on a cluster)."""

    recorded = manifest.get("input_files")
    if recorded is None:
        return []
    try:
        current = input_record(storage.expand_inputs(task.raw_inputs(cfg)))
    except FileNotFoundError as err:
        log.info(
            "%s: this run's raw inputs are not here (%s); the prepared folder's inputs are not compared",
            task.name,
            redaction.redact(str(err)),
        )
        return []
    return (
        _changed_in_place(recorded, current)
        or _other_files(recorded, current)
        or _other_bytes_elsewhere(recorded, current)
    )


def _changed_in_place(recorded: list[dict], current: list[dict]) -> list[str]:
    """Recorded files whose size or modification time changed at the same place (and, where a
    sha256 is recorded, whose bytes changed too)."""
    here = {r["file"]: r for r in current}
    changed = []
    for old in recorded:
        now = here.get(old["file"], old)
        if (now["size"], now["mtime_ns"]) == (old["size"], old["mtime_ns"]):
            continue
        other_bytes = ""
        if now["size"] == old["size"] and old.get("sha256"):  # the same bytes copied anew?
            if storage.file_sha256(old["file"]) == old["sha256"]:
                log.info(
                    "%s: modified %s, after it was prepared, but holds the bytes prepared (sha256 %s)",
                    old["file"],
                    _when(now["mtime_ns"]),
                    old["sha256"][:12],
                )
                continue
            other_bytes = ", other bytes"
        changed.append(
            f"{old['file']} changed since it was prepared (size {old['size']} -> {now['size']}, "
            f"modified {_when(old['mtime_ns'])} -> {_when(now['mtime_ns'])}{other_bytes})"
        )
    return changed


def _other_files(recorded: list[dict], current: list[dict]) -> list[str]:
    """Files by name and size: those of the folder not among this run's, and the reverse."""
    before, after = (
        Counter(f"{storage.name(r['file'])} ({r['size']} bytes)" for r in records) for records in (recorded, current)
    )
    if before != after:
        gone, added = sorted((before - after).elements()), sorted((after - before).elements())
        return [
            f"other files: {len(gone)} of the folder's not among this run's ({_names(gone)}), "
            f"{len(added)} of this run's not among the folder's ({_names(added)})"
        ]
    return []


def _other_bytes_elsewhere(recorded: list[dict], current: list[dict]) -> list[str]:
    changed = []
    # The same names and sizes elsewhere (a copy of the data, a submitted job's copy of the project):
    # where the manifest holds digests, a local copy must also hold the bytes prepared.
    digests: dict[tuple, set] = {}
    for r in recorded:
        if r.get("sha256"):
            digests.setdefault((storage.name(r["file"]), r["size"]), set()).add(r["sha256"])
    prepared_paths = {r["file"] for r in recorded}
    for r in current:
        known = digests.get((storage.name(r["file"]), r["size"]))
        if r["file"] in prepared_paths or not known or storage.is_uri(r["file"]):
            continue
        digest = storage.file_sha256(r["file"])
        if digest not in known:
            changed.append(
                f"{r['file']}: the name and size of a file the folder was prepared from, other bytes "
                f"(sha256 {digest[:12]}, prepared {', '.join(sorted(d[:12] for d in known))})"
            )
    return changed


def count_problem(task: Task, manifest: dict[str, Any]) -> str | None:
    """Where a manifest's counts disagree with its shard records (`pairs`: every shard's rows;
    `SPLIT_pairs`: that split's) or with each other (Task.count_problem), as 'KEY=N but ...'."""
    rows = {split: sum(shard["rows"] for shard in listed) for split, listed in manifest["shards"].items()}
    recorded = {"pairs": sum(rows.values())} | {f"{split}_pairs": n for split, n in rows.items()}
    for key, n in recorded.items():
        if key not in manifest:
            continue
        if type(manifest[key]) is not int:
            return f"{key}: not a count ({manifest[key]!r})"
        if manifest[key] != n:
            return f"{key}={manifest[key]} but its shards hold {n} rows"
    return task.count_problem(manifest)


def _check_shards(task: Task, folder: str, manifest: dict[str, Any], manifest_path: str, again: str) -> None:
    """verify_prepared's shard checks: each split folder holds exactly the manifest's shards, each
    as its record says. A shard listed at its record's size and the time `shard_times` recorded is
    the file `prepare` wrote, its record `prepare`'s: nothing of it is read. Any other is read whole
    (shard_problem: its footer, sha256, columns and labels), with one line for those."""
    listed = listed_shards(folder, manifest["shards"])
    written, hashed = as_written(manifest, listed), 0
    for split, records in manifest["shards"].items():
        split_dir = storage.join(folder, split)
        present, expected = set(listed[split]), {s["file"] for s in records}
        if present != expected:
            missing, extra = sorted(expected - present), sorted(present - expected)
            raise BadInputError(
                f"{split_dir}: shards do not match {manifest_path} (missing {missing[:3]}, "
                f"not listed {extra[:3]}); {again}"
            )
        for shard in records:
            if shard["file"] in written[split]:
                continue
            hashed += 1
            path = storage.join(split_dir, shard["file"])
            try:
                problem = shard_problem(task, path, shard)
            except BadInputError as err:  # a corrupt footer, a truncated file
                raise BadInputError(f"{err}; {again}") from None
            if problem:
                raise BadInputError(f"{path}: {problem}; {again}")
    if hashed:
        log.info(
            "%s: %d shard(s) listed at other times than `prepare` wrote them (a copy, or a folder prepared before "
            "shard times were recorded): read whole for their sha256, on every run; prepare where you train, or "
            "copy keeping the times (cp -p), to skip it",
            folder,
            hashed,
        )


def verify_prepared(task: Task, prepared_root: str, cfg: RunConfig | None = None) -> dict[str, Any]:
    """The task's prepared folder is complete and unchanged: its manifest exists and lists exactly
    the shard files present with their row counts, sizes and sha256 (_check_shards: a shard listed
    at the size and time `prepare` recorded is not read, any other is read whole); with `cfg`, it
    was also prepared with the run's values of prepared_keys. Returns the manifest; raises naming
    what is wrong."""
    folder = task.prepared_dir(prepared_root)
    manifest_path = storage.join(folder, MANIFEST)
    again = f"delete {folder} and run `convsts prepare` again"
    if not storage.is_file(manifest_path):
        if storage.is_dir(folder):
            raise BadInputError(
                f"{folder} has shards but no {MANIFEST}: an interrupted or older `convsts prepare`; {again}"
            )
        raise FileNotFoundError(
            f"{task.name} shards not found at {folder}; run `convsts prepare all --out {prepared_root}` first"
        )
    try:
        manifest = json.loads(storage.read_text(manifest_path))
    except ValueError as err:
        raise BadInputError(f"{manifest_path}: not JSON ({err}); {again}") from None
    problem = manifest_shape_problem(manifest)
    if problem:
        raise BadInputError(f"{manifest_path}: {problem}; {again}")
    _check_shards(task, folder, manifest, manifest_path, again)
    problem = count_problem(task, manifest)
    if problem:
        raise BadInputError(f"{manifest_path}: {problem}; {again}")
    differs = settings_mismatches(task, manifest, redact_tree(cfg.to_dict())) if cfg is not None else []
    new_folder = (
        "prepare this run's data into a new folder (`convsts prepare all --config ... --out NEW`, then --prepared NEW)"
    )
    if differs:
        raise BadInputError(
            f"{manifest_path}: prepared with {'; '.join(differs)}; {new_folder} "
            f"or set these keys to the folder's values"
        )
    changed = input_changes(task, manifest, cfg) if cfg is not None else []
    if changed:
        raise BadInputError(
            f"{manifest_path}: prepared from other raw inputs than this run's: {'; '.join(changed)}; "
            f"{new_folder}, or delete {folder} to prepare it again"
        )
    return manifest


def _own_entries(out_dir: str) -> list[str]:
    """out_dir's entries other than the lock and marker files a prepare keeps there while it runs."""
    return [n for n in storage.entry_names(out_dir) if n not in (LOCK_FILE, PREPARE_MARKER)]


def interrupted_prepare(task: Task, out_dir: str) -> bool:
    """out_dir holds what an interrupted `prepare` of this task leaves and nothing else: its marker
    (PREPARE_MARKER, written before the first shard), no manifest (written last), and only split
    folders (`splits`) of parquet shards. Parquet files that no prepare marked are the user's."""
    if not storage.is_file(storage.join(out_dir, PREPARE_MARKER)):
        return False
    for entry in _own_entries(out_dir):
        split_dir = storage.join(out_dir, entry)
        if entry not in task.splits or not storage.is_dir(split_dir):
            return False
        if any(
            not n.endswith(".parquet") or not storage.is_file(storage.join(split_dir, n))
            for n in storage.entry_names(split_dir)
        ):
            return False
    return True


def prepare_into(task: Task, inputs: list[str], out_dir: str, cfg: RunConfig) -> dict[str, Any]:
    """`prepare` into an empty (or new) out_dir, holding it (a local one: output_lock) so that two
    prepares never write one folder. A folder that an interrupted prepare of this task left
    (interrupted_prepare) has its shards removed and is prepared again, so the same command, run again,
    resumes; any other content is refused and left as it is, never added to (more shards would be
    more rows)."""
    held = contextlib.nullcontext() if storage.is_uri(out_dir) else output_lock(out_dir, "prepare")
    with held:
        if storage.has_entries(out_dir) and _own_entries(out_dir):
            if storage.is_file(storage.join(out_dir, MANIFEST)):
                raise FileExistsError(
                    f"{out_dir} already holds a prepared {task.name} folder ({MANIFEST}); choose a new --out folder"
                )
            if not interrupted_prepare(task, out_dir):
                raise FileExistsError(
                    f"{out_dir} is not empty and holds no interrupted `convsts prepare` of {task.name} (no "
                    f"{PREPARE_MARKER}); nothing there was changed; choose a new --out folder"
                )
            log.warning(
                "%s: shards of an interrupted `convsts prepare` (no %s): removed, prepared again", out_dir, MANIFEST
            )
            for entry in _own_entries(out_dir):
                storage.delete_folder(storage.join(out_dir, entry))
        marker = storage.join(out_dir, PREPARE_MARKER)
        storage.write_text(marker, json.dumps({"task": task.name}) + "\n")
        try:
            manifest = task.prepare(inputs, out_dir, cfg)
        except BaseException:
            if not _own_entries(out_dir):  # stopped before its first shard: nothing of it is left
                storage.delete_file(marker)
            raise
        storage.delete_file(marker)
        return manifest
