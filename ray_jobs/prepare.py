"""`convsts prepare`: raw Reddit and SNLI inputs -> parquet shards + manifest.json (Ray Data).

  convsts prepare reddit --input PATH [PATH ...] --out DIR [--format auto|pushshift|pairs]
  convsts prepare snli --input PATH --out DIR
  convsts prepare all --config configs/demo.yaml --out DIR     # both, from the run config
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence

from datasets import reddit, snli, storage
from ray_jobs.config import RunConfig, load_config, resolve_path
from ray_jobs.runtime import ensure_ray, log, setup_logging

MANIFEST = "manifest.json"


def expand_inputs(inputs: Sequence[str]) -> List[str]:
    """Files, folders (their files) and globs, local or URIs (s3://, gs://, ...) -> a sorted list of
    files; missing inputs raise."""
    files: List[str] = []
    for item in inputs:
        item = resolve_path(item)
        if storage.is_dir(item):
            found = storage.list_files(item)
        elif storage.has_wildcards(item):
            found = storage.glob(item)
        elif storage.is_file(item):
            found = [item]
        else:
            raise FileNotFoundError(f"input not found: {item}")
        if not found:
            raise FileNotFoundError(f"no input files in {item}")
        files.extend(found)
    return files


def prepare_reddit(inputs: Sequence[str], out_dir: str | Path, cfg: RunConfig, fmt: str = "auto") -> Dict[str, Any]:
    """Reddit inputs -> out_dir/{train,test} shards + out_dir/manifest.json (out_dir local or a URI)."""
    started = time.time()
    files = expand_inputs(inputs)
    formats = {f: (reddit.detect_format(f) if fmt == "auto" else fmt) for f in files}
    kinds = set(formats.values())
    if len(kinds) != 1:
        raise ValueError(f"mixed input formats {sorted(kinds)}; prepare them separately: {formats}")
    kind = kinds.pop()
    out_dir = str(out_dir)
    if storage.has_entries(out_dir):
        raise FileExistsError(f"{out_dir} is not empty; choose a new --out folder")
    ensure_ray()
    log.info("reddit: %d %s file(s) -> %s", len(files), kind, out_dir)
    if kind == "pairs":
        annotated = reddit.pairs_dataset(files, cfg.filters, cfg.data.test_share, cfg.data.split_salt)
    else:
        annotated = reddit.pushshift_dataset(files, cfg.filters, cfg.data.test_share, cfg.data.split_salt)
    counts = reddit.write_pairs(annotated, out_dir, cfg.data.rows_per_shard)
    manifest = {
        "format": kind,
        "inputs": files,
        **counts,
        "test_share": cfg.data.test_share,
        "split_salt": cfg.data.split_salt,
        "filters": cfg.to_dict()["filters"],
        "seconds": round(time.time() - started, 1),
    }
    storage.write_text(storage.join(out_dir, MANIFEST), json.dumps(manifest, indent=2))
    log.info(
        "reddit: %d lines read, %d pairs (%d train / %d test), %d filtered, %d unpaired, %d malformed",
        manifest["lines_read"], manifest["pairs"], manifest["train_pairs"], manifest["test_pairs"],
        sum(manifest["filtered_by_rule"].values()), manifest["unpaired"], manifest["malformed"],
    )
    return manifest


def prepare_snli(path: str, out_dir: str | Path, cfg: RunConfig) -> Dict[str, Any]:
    import ray.data

    path = resolve_path(path)
    out_dir = str(out_dir)
    ensure_ray()
    frame = snli.with_fraction_rank(snli.read_snli(path), cfg.data.snli_fraction_seed)
    target, fs = storage.path_and_filesystem(storage.join(out_dir, "train"))
    ray.data.from_pandas(frame).write_parquet(target, filesystem=fs, min_rows_per_file=cfg.data.rows_per_shard)
    manifest = {
        "input": path,
        "pairs": len(frame),
        "labels": snli.label_counts(frame),
        "fraction_seed": cfg.data.snli_fraction_seed,
    }
    storage.write_text(storage.join(out_dir, MANIFEST), json.dumps(manifest, indent=2))
    log.info("snli: %d pairs -> %s", len(frame), out_dir)
    return manifest


def prepare_all(cfg: RunConfig, out_dir: str | Path) -> Dict[str, Any]:
    return {
        "reddit": prepare_reddit(cfg.data.reddit_inputs, storage.join(out_dir, "reddit"), cfg, cfg.data.reddit_format),
        "snli": prepare_snli(cfg.data.snli_train, storage.join(out_dir, "snli"), cfg),
    }


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="convsts prepare", description=__doc__,
                                               formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["reddit", "snli", "all"])
    parser.add_argument("--input", nargs="+", help="input files, folders or globs (reddit, snli)")
    parser.add_argument("--format", default=None, choices=["auto", "pushshift", "pairs"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", default=None, help="run config YAML (filters, split, shard size)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. data.test_share=0.1")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    cfg = load_config(args.config, args.overrides)
    if args.what == "reddit":
        result = prepare_reddit(args.input or cfg.data.reddit_inputs, args.out, cfg,
                                args.format or cfg.data.reddit_format)
    elif args.what == "snli":
        result = prepare_snli((args.input or [cfg.data.snli_train])[0], args.out, cfg)
    else:
        result = prepare_all(cfg, args.out)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
