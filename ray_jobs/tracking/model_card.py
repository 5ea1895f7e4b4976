"""The model card of a model folder: README.md with a YAML header, as Hugging Face model cards have.

The facts it is made from live beside it in card.json (the run, its data, commit, library versions
and, once `convsts evaluate` has run, the results), so evaluation can add its results and render
the card again without the training run at hand.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from convsts.io import storage
from convsts.io.redaction import redact, redact_tree
from convsts.models.checkpoint import CONFIG_FILE, parameter_counts, read_meta
from convsts.models.encoders import PretrainedEncoder
from convsts.ray_jobs.runtime.provenance import git_commit, library_versions, machine

PACKAGED_MODEL = (
    "sentence-transformers/all-MiniLM-L6-v2"  # the weights of convsts.datasets.pretrained.PRETRAINED_PACKAGE
)
CARD_FILE = "README.md"
FACTS_FILE = "card.json"
# The metrics the card lists, in reading order (all of them are in the run's results.json).
CARD_METRICS = (
    ("stsb/dev/pearson", "STS Benchmark dev, Pearson r (raw cosine)"),
    ("stsb/test/pearson", "STS Benchmark test, Pearson r (raw cosine)"),
    ("stsb_tuned/dev/pearson", "STS Benchmark dev, Pearson r (tuned STS matrix)"),
    ("stsb_tuned/test/pearson", "STS Benchmark test, Pearson r (tuned STS matrix)"),
    ("reddit/p_at_1", "Reddit held-out threads, P@1 (100 candidates)"),
    ("reddit/p_at_10", "Reddit held-out threads, P@10"),
    ("snli/test/accuracy", "SNLI test accuracy (NLI head)"),
    ("cqa2016/map", "SemEval-2016 CQA subtask B, MAP"),
)


def run_facts(
    run_config: Mapping[str, Any],
    manifests: Mapping[str, Mapping[str, Any]],
    digests: Mapping[str, str],
    run_id: str | None,
    tracking_uri: str | None,
    seconds: float | None = None,
) -> dict[str, Any]:
    """What a training run knows about the model it wrote: config, data, code, libraries, machine."""
    data = {}
    for task, manifest in manifests.items():
        inputs = manifest.get("inputs") or ([manifest["input"]] if manifest.get("input") else [])
        data[task] = {
            "inputs": [redact(str(i)) for i in inputs],
            # Reddit splits train/test; SNLI's train file is all training pairs.
            "train_pairs": manifest.get("train_pairs", manifest.get("pairs")),
            "test_pairs": manifest.get("test_pairs", 0),
            "digest": digests.get(task),
        }
    return {
        "name": run_config.get("name"),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "mlflow_run_id": run_id,
        "tracking_uri": redact(tracking_uri or ""),
        "train_seconds": seconds,
        "commit": git_commit(),
        "libraries": library_versions(),
        "machine": machine(),
        "data": data,
        "run_config": redact_tree(dict(run_config)),
        "results": {},
    }


def _architecture(meta: dict[str, Any]) -> dict[str, Any]:
    model = meta["model"]
    arch = dict(model[model["encoder"]])
    arch.pop("hf_config", None)  # the full transformers config; config.json has it
    return arch


def _base_model(meta: dict[str, Any]) -> str | None:
    """The pretrained weights a pretrained-encoder model started from (their folder or URI, or the
    packaged all-MiniLM-L6-v2)."""
    if meta["model"]["encoder"] != PretrainedEncoder.name:
        return None
    return redact(meta["model"]["pretrained"].get("path") or PACKAGED_MODEL)


def render(folder: Path, facts: dict[str, Any]) -> str:
    meta = read_meta(folder)
    results = {k: v for k, v in facts.get("results", {}).items() if isinstance(v, (int, float))}
    lines = _model_section(folder, facts, meta, _card_header(folder, facts, meta, results))
    lines += _data_and_training_section(facts)
    lines += _evaluation_section(results)
    lines += _loading_section(folder, facts)
    return "\n".join(lines)


def _card_header(
    folder: Path, facts: dict[str, Any], meta: dict[str, Any], results: dict[str, float]
) -> dict[str, Any]:
    """The Hugging Face model card's YAML header (model-index with the headline metrics)."""
    encoder = meta["model"]["encoder"]
    header: dict[str, Any] = {
        "library_name": "convsts",
        "pipeline_tag": "sentence-similarity",
        "tags": ["sentence-similarity", "sentence-embeddings", "convsts", f"encoder-{encoder}"],
        "datasets": sorted(facts.get("data", {})),
        "metrics": [name for name, _ in CARD_METRICS if name in results],
    }
    base = _base_model(meta)
    if base:
        header["base_model"] = base
    if results:
        header["model-index"] = [
            {
                "name": facts.get("name") or folder.name,
                "results": [
                    {
                        "task": {"type": "sentence-similarity"},
                        "dataset": {"name": name.split("/")[0]},
                        "metrics": [{"type": name, "value": round(float(results[name]), 4), "name": label}],
                    }
                    for name, label in CARD_METRICS
                    if name in results
                ],
            }
        ]
    return header


def _model_section(folder: Path, facts: dict[str, Any], meta: dict[str, Any], header: dict[str, Any]) -> list[str]:
    encoder, base = meta["model"]["encoder"], header.get("base_model")
    counts = parameter_counts(folder)
    lines = [
        "---",
        yaml.safe_dump(header, sort_keys=False).rstrip(),
        "---",
        "",
        f"# {facts.get('name') or folder.name}",
        "",
        "A sentence encoder trained with convsts: the multitask method of *Learning Semantic Textual Similarity "
        "from Conversations* (Yang et al., 2018): Reddit input-response prediction with in-batch softmax, "
        "plus SNLI classification, on one shared encoder.",
        "",
        "## Model",
        "",
        f"- encoder: `{encoder}`" + (f", initialized from `{base}`" if base else ""),
        f"- parameters: {counts['encoder']:,} in the encoder, {counts['heads']:,} in the task heads "
        f"({', '.join(f'{t}: {k}' for t, k in meta.get('heads', {}).items())})",
        f"- embedding: {_output_dim(meta)} dimensions, unit length",
        f"- architecture: `{json.dumps(_architecture(meta), sort_keys=True)}`",
        "",
        "## Training data",
        "",
    ]
    return lines


def _data_and_training_section(facts: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for task, d in sorted(facts.get("data", {}).items()):
        inputs = ", ".join(f"`{i}`" for i in d["inputs"][:4]) + (" ..." if len(d["inputs"]) > 4 else "")
        lines.append(
            f"- {task}: {d.get('train_pairs') or 0:,} training pairs, {d.get('test_pairs') or 0:,} held out "
            f"(prepared from {inputs or 'injected rows'}; manifest digest `{(d.get('digest') or '')[:12]}`)"
        )
    trainer = facts.get("run_config", {}).get("trainer", {})
    lines += [
        "",
        "## Training",
        "",
        f"- steps: {trainer.get('steps')}, workers: {trainer.get('num_workers')}, task weights: "
        f"{trainer.get('task_weights')}, optimizer: {trainer.get('optimizer')}, stages: {trainer.get('stages')}",
        f"- time: {facts['train_seconds']:.0f} s" if facts.get("train_seconds") else "- time: not recorded",
        f"- MLflow run: `{facts.get('mlflow_run_id')}` in `{facts.get('tracking_uri')}`",
        f"- code: convsts commit `{facts.get('commit') or 'unknown (not a git checkout)'}`",
        f"- libraries: {', '.join(f'{k} {v}' for k, v in facts.get('libraries', {}).items())}",
        f"- machine: {', '.join(f'{k} {v}' for k, v in facts.get('machine', {}).items())}",
        f"- the full run config is in `{CONFIG_FILE}` (`run_config`)",
        "",
        "## Evaluation",
        "",
    ]
    return lines


def _evaluation_section(results: dict[str, float]) -> list[str]:
    lines: list[str] = []
    if results:
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {label} | {results[name]:.4f} |" for name, label in CARD_METRICS if name in results]
        lines += ["", "All metrics: `card.json` (`results`), from `convsts evaluate`."]
    else:
        lines.append(
            "Not evaluated yet: `convsts evaluate --checkpoint <this folder> --out DIR` adds the results here."
        )
    return lines


def _loading_section(folder: Path, facts: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    lines += [
        "",
        "## How to load",
        "",
        "```python",
        "from convsts.models.sentence_encoder import load  # pip install convsts (this project)",
        "",
        f'encoder = load("{folder.name}")',
        'encoder.encode("a man is playing a guitar")            # (dim,) unit length',
        'encoder.encode(["one", "two"], batch_size=64)          # (2, dim)',
        "```",
        "",
        "As an MLflow model (`pyfunc`: a column `text` of strings in, embeddings out): "
        f'`mlflow.pyfunc.load_model("runs:/{facts.get("mlflow_run_id")}/model")`; served with '
        f"`mlflow models serve -m runs:/{facts.get('mlflow_run_id')}/model --env-manager local`.",
        "",
    ]
    return lines


def _output_dim(meta: dict[str, Any]) -> Any:
    arch = meta["model"][meta["model"]["encoder"]]
    if meta["model"]["encoder"] == PretrainedEncoder.name:
        return arch.get("output_dim") or (arch.get("hf_config") or {}).get("hidden_size")
    return arch.get("output_dim") or 2 * arch.get("hidden_size", 0)


def write_card(folder: str | Path, facts: dict[str, Any]) -> Path:
    folder = Path(folder)
    storage.write_text(folder / FACTS_FILE, json.dumps(facts, indent=2, default=str))
    storage.write_text(folder / CARD_FILE, render(folder, facts))
    return folder / CARD_FILE


def add_results(folder: str | Path, results: Mapping[str, Any]) -> Path | None:
    """Record evaluation results in a model folder's card (None when the folder has no card.json)."""
    folder = Path(folder)
    if not (folder / FACTS_FILE).is_file():
        return None
    facts = json.loads((folder / FACTS_FILE).read_text(encoding="utf-8"))
    facts["results"] = {k: v for k, v in results.items() if isinstance(v, (int, float))}
    return write_card(folder, facts)
