"""Two evaluations compared item by item: the paired difference of their P@N on the same queries.

Every evaluation writes each task's per-item outcomes beside its results.json (`OUT/items/<task>.parquet`:
for Reddit, each query's hash, its candidates' hash and the true response's rank). Two evaluations
with the same `eval.seed`, `eval.reddit_pairs` and held-out pairs rank the same queries among the
same candidates, so their P@N difference is judged on the per-query differences: its standard
error is a fraction of either P@N's own (both systems meet the same easy and hard queries).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from convsts.io import storage
from convsts.io.errors import BadInputError
from convsts.ray_jobs.evaluation.metrics import paired_difference

ITEMS_DIR = "items"  # OUT/items/<task>.parquet beside results.json
KEY_COLUMNS = ("query", "candidates")
RANKS = (1, 3, 10)


def write_items(items_dir: Path, task: str, items: pd.DataFrame) -> Path:
    items_dir.mkdir(parents=True, exist_ok=True)
    path = items_dir / f"{task}.parquet"
    with storage.write_errors(path):  # a full disk names the file
        items.to_parquet(path, index=False)
    return path


def read_items(evaluation: Path) -> dict[str, pd.DataFrame]:
    """{task: per-item frame} of an evaluation folder (`convsts evaluate --out`, or a demo's eval folders)."""
    folder = Path(evaluation) / ITEMS_DIR
    if not folder.is_dir():
        raise BadInputError(
            f"{evaluation}: no {ITEMS_DIR}/ folder of per-query outcomes; give folders that "
            f"`convsts evaluate --out` (or the demo's eval, eval_untrained) wrote"
        )
    found = {}
    for path in sorted(folder.glob("*.parquet")):
        try:
            frame = pd.read_parquet(path)
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
            raise BadInputError(f"{path}: not a parquet file ({err}); evaluate again into {evaluation}") from None
        missing = [c for c in (*KEY_COLUMNS, "rank") if c not in frame.columns]
        if missing:
            raise BadInputError(f"{path}: no column(s) {', '.join(missing)}; not an evaluation's per-query file")
        found[path.stem] = frame
    return found


def paired_rank_metrics(
    a: pd.DataFrame, b: pd.DataFrame, task: str, suffix: str = "diff", labels: Sequence[str] = ("a", "b")
) -> dict[str, float]:
    """<task>/p_at_N_<suffix> (a's P@N minus b's on the same queries) and its paired standard error
    <task>/p_at_N_<suffix>_stderr, and <task>/paired_queries. Refused when the two did not rank the
    same queries among the same candidates (another seed, query count or held-out folder)."""
    # A query pair drawn twice (equal rows in the held-out split) is told apart by its occurrence.
    left, right = (
        f.assign(occurrence=f.groupby(list(KEY_COLUMNS)).cumcount()).set_index([*KEY_COLUMNS, "occurrence"])["rank"]
        for f in (a, b)
    )
    if len(left) != len(right) or not left.index.sort_values().equals(right.index.sort_values()):
        shared = len(left.index.intersection(right.index))
        raise BadInputError(
            f"{task}: {labels[0]} and {labels[1]} ranked other queries or candidates ({len(left)} and "
            f"{len(right)} queries, {shared} the same): evaluate both with the same eval.seed, "
            f"eval.reddit_pairs, eval.reddit_negatives and prepared folder"
        )
    ranks_a, ranks_b = left.to_numpy(), right.loc[left.index].to_numpy()  # (q,) each, the same queries in order
    finite = np.isfinite(ranks_a).all() and np.isfinite(ranks_b).all()  # a NaN rank: that evaluation's P@N is NaN too
    out: dict[str, float] = {}
    for n in RANKS:
        diff, stderr = (
            paired_difference((ranks_a <= n).astype(float), (ranks_b <= n).astype(float))
            if finite
            else (float("nan"), float("nan"))
        )
        out[f"{task}/p_at_{n}_{suffix}"] = diff
        out[f"{task}/p_at_{n}_{suffix}_stderr"] = stderr
    out[f"{task}/paired_queries"] = float(len(left))
    return out


def compare_evaluations(a: Path, b: Path, suffix: str = "diff") -> dict[str, float]:
    """The paired metrics of every task whose per-item file both evaluation folders hold."""
    items_a, items_b = read_items(a), read_items(b)
    shared = sorted(set(items_a) & set(items_b))
    if not shared:
        raise BadInputError(
            f"{a} ({', '.join(sorted(items_a)) or 'none'}) and {b} "
            f"({', '.join(sorted(items_b)) or 'none'}) hold no task's per-query outcomes in common"
        )
    out: dict[str, float] = {}
    for task in shared:
        out.update(paired_rank_metrics(items_a[task], items_b[task], task, suffix, labels=(str(a), str(b))))
    return out


def write_comparison(a: Path, b: Path, out: Path) -> str:
    """`convsts evaluate --compare A B --out OUT`: the paired P@N differences of A and B (and each
    side's own metrics) as OUT/compare.json and OUT/compare.md; returns the table."""
    paired = compare_evaluations(a, b)
    results = {name: read_results(folder) for name, folder in zip("ab", (a, b))}
    rows = []
    for name in sorted(
        (k for k in paired if k.endswith("_diff")), key=lambda k: (k.split("/")[0], int(k.rsplit("_", 2)[-2]))
    ):  # reddit/p_at_N_diff: N = 1, 3, 10
        metric = name[: -len("_diff")]
        rows.append(
            f"| {metric} | {_cell(results['a'].get(metric))} | {_cell(results['b'].get(metric))} | "
            f"{paired[name]:+.4f} | {paired[name + '_stderr']:.4f} |"
        )
    queries = "; ".join(
        f"{k.split('/')[0]}: {v:.0f} queries" for k, v in paired.items() if k.endswith("/paired_queries")
    )
    table = "\n".join(
        [
            f"A = {a}",
            f"B = {b}",
            "",
            "| metric | A | B | A - B | paired stderr |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"paired on the same queries and candidates ({queries})",
        ]
    )
    out.mkdir(parents=True, exist_ok=True)
    storage.write_text(out / "compare.json", json.dumps({"a": str(a), "b": str(b), **paired}, indent=2))
    storage.write_text(out / "compare.md", table + "\n")
    return table


def read_results(folder: Path) -> dict:
    """An evaluation folder's results.json ({} when it has none: the table then shows only the differences)."""
    path = folder / "results.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except ValueError as err:
        raise BadInputError(f"{path}: not JSON ({err})") from None
    return data if isinstance(data, dict) else {}


def _cell(value) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else "—"
