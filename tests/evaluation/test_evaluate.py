"""`convsts evaluate` on a tiny real checkpoint (no Ray needed): result names, tuned matrix, MLflow."""

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from convsts.datasets.config import TokenizerConfig
from convsts.datasets.evalsets import read_stsb, stsb_split_path
from convsts.datasets.text import DanTokenizer, count_words
from convsts.io.errors import BadInputError
from convsts.io.storage import resolve_path
from convsts.models.checkpoint import build_model, save_checkpoint
from convsts.models.config import DanConfig, ModelConfig
from convsts.models.sentence_encoder import load
from convsts.models.sts_transform import FILE_NAME, load_sts_transform
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.pipelines.evaluate import run_evaluation


def test_evaluate_checkpoint(sample_checkpoint, tmp_path, mlflow_uri, caplog):
    sts_file = tmp_path / "my_sts.tsv"
    pd.DataFrame(
        {
            "sentence1": ["a cat sits", "a man runs", "rain falls", "two dogs play"],
            "sentence2": ["a cat is sitting", "the stock fell", "it is raining", "dogs are playing"],
            "score": [4.8, 0.2, 4.0, 4.5],
        }
    ).to_csv(sts_file, sep="\t", index=False)
    cfg = load_config(None, ["eval.tuned.epochs=3"])
    out = tmp_path / "eval"
    with caplog.at_level(logging.INFO, logger="convsts"):
        results = run_evaluation(
            cfg, out, checkpoint=str(sample_checkpoint), sts_files=[str(sts_file)], mlflow_uri=mlflow_uri
        )
    # Never silent: a line as each benchmark starts (STS-B, the tuned matrix, the --sts file, the
    # two tasks, CQA), numbered, then the total.
    stages = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[eval] ")]
    assert [line.split(":")[0] for line in stages[:-1]] == [f"[eval] model {i}/6" for i in range(1, 7)], stages
    assert "STS set my_sts" in stages[2] and "s left)" in stages[5]
    assert stages[-1].startswith("[eval] model: 6 benchmark(s) in ")

    saved = json.loads((out / "results.json").read_text())
    assert saved == json.loads(json.dumps(results))
    for split in ("dev", "test"):
        for name in (
            f"stsb/{split}/pearson",
            f"stsb/{split}/spearman",
            f"stsb/{split}/captions/pearson",
            f"stsb/{split}/forums/pearson",
            f"stsb/{split}/news/pearson",
            f"stsb_tuned/{split}/pearson",
            f"stsb_tuned/{split}/news/pearson",
        ):
            assert -1 <= saved[name] <= 1, name
    assert {"sts/my_sts/pearson", "sts/my_sts/spearman", "snli/dev/accuracy", "cqa2016/map"} <= set(saved)
    assert not any(k.startswith("reddit/") for k in saved)  # no prepared held-out split was given
    # Selected on dev: the tuned dev score is never below the untuned one (epoch 0 is the identity).
    assert saved["stsb_tuned/dev/pearson"] >= saved["stsb/dev/pearson"] - 1e-6

    # The matrix sits beside the checkpoint's weights and in the output folder, and encode(tuned=True) uses it.
    transform = load_sts_transform(sample_checkpoint)
    assert (out / FILE_NAME).is_file() and transform.matrix.shape == (16, 16)
    assert transform.dev_pearson == pytest.approx(saved["stsb_tuned/dev/pearson"], abs=1e-6)
    encoder = load(sample_checkpoint)
    plain = encoder.encode(["a man is playing a guitar"])
    assert np.allclose(encoder.encode(["a man is playing a guitar"], tuned=True), plain @ transform.matrix)
    # The matrix joined the checkpoint's manifest: every reader verifies it as it does the weights.
    from convsts.models.checkpoint import MANIFEST_FILE, verified_folder

    listed = json.loads((Path(sample_checkpoint) / MANIFEST_FILE).read_text())["files"]
    assert listed[FILE_NAME]["bytes"] == (Path(sample_checkpoint) / FILE_NAME).stat().st_size
    damaged = tmp_path / "damaged"
    shutil.copytree(sample_checkpoint, damaged)
    matrix = bytearray((damaged / FILE_NAME).read_bytes())
    matrix[-1] ^= 0xFF
    (damaged / FILE_NAME).write_bytes(bytes(matrix))
    with pytest.raises(BadInputError, match=f"{FILE_NAME} differs from its manifest's sha256"):
        verified_folder(damaged)

    from mlflow.tracking import MlflowClient

    run = MlflowClient(mlflow_uri).get_run(saved["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["stsb_tuned/dev/pearson"] == pytest.approx(saved["stsb_tuned/dev/pearson"])
    assert run.data.params["checkpoint"] == str(sample_checkpoint)


def test_baseline_has_no_tuned_metrics(tmp_path):
    cfg = load_config(None, ["data.cqa_test=''"])
    stale = tmp_path / "bow" / "items" / "reddit.parquet"  # an earlier evaluation into the same --out, with Reddit
    stale.parent.mkdir(parents=True)
    pd.DataFrame({"query": [1], "candidates": [2], "rank": [1.0]}).to_parquet(stale)
    results = run_evaluation(cfg, tmp_path / "bow", baseline="bow", log_to_mlflow=False)
    assert 0 < results["stsb/dev/pearson"] < 1
    assert not any(k.startswith("stsb_tuned/") for k in results)
    assert not stale.exists()  # this evaluation scored no queries: nothing of the earlier one's is left to compare


def test_tuned_without_checkpoint_matrix_is_a_clear_error(sample_checkpoint):
    with pytest.raises(FileNotFoundError, match="sts_transform.safetensors"):
        load(sample_checkpoint).encode(["x"], tuned=True)


def test_fraction_curve_from_checkpoints(tmp_path):
    from convsts.ray_jobs.evaluation.curve import CURVE_METRICS, fraction_curve

    stsb = read_stsb(stsb_split_path(resolve_path("{sample}"), "dev"))
    tokenizer = DanTokenizer.build(count_words(list(stsb["sentence1"])), TokenizerConfig(bigram_buckets=100))
    config = ModelConfig(
        dan=DanConfig(embedding_dim=8, hidden_sizes=[8], output_dim=8), response_hidden=8, nli_hidden=8
    )
    checkpoints = []
    for fraction in (1.0, 0.5):
        run = load_config(None, [f"data.snli_fraction={fraction}"]).to_dict()
        checkpoints.append(
            str(save_checkpoint(tmp_path / f"f{fraction}", build_model(config, tokenizer).eval(), tokenizer, run))
        )
    rows = fraction_curve(checkpoints, load_config(), tmp_path / "curve")
    assert [r["fraction"] for r in rows] == [0.5, 1.0]
    assert all(-1 <= r[m] <= 1 for r in rows for m in CURVE_METRICS)
    assert (tmp_path / "curve" / "curve.png").stat().st_size > 0
    assert list(pd.read_csv(tmp_path / "curve" / "curve.csv")["fraction"]) == [0.5, 1.0]
    bare = save_checkpoint(tmp_path / "bare", build_model(config, tokenizer).eval(), tokenizer, {})
    with pytest.raises(ValueError, match="no data.snli_fraction"):
        fraction_curve([str(bare)], load_config(), tmp_path / "curve2")


def test_results_table_groups_metrics_in_reading_order_with_systems_in_columns():
    from convsts.ray_jobs.pipelines.evaluate import results_table

    model = {
        "reddit/p_at_10": 0.8,
        "reddit/p_at_1": 0.5,
        "reddit/p_at_3": 0.6,
        "reddit/queries": 1000.0,
        "reddit/p_at_1_stderr": 0.0158,
        "stsb/test/pearson": 0.83,
        "stsb/dev/pearson": 0.87,
        "stsb/dev/news/pearson": 0.77,
        "stsb_tuned/test/pearson": 0.85,
        "snli/dev/accuracy": 0.56,
        "cqa2016/map": 0.75,
        "eval/nonfinite_metrics": 0.0,
    }
    table = results_table({"model": model, "tfidf": {"stsb/dev/pearson": 0.74, "reddit/p_at_1": 0.33}})
    rows = [line.split("|")[1].strip() for line in table.splitlines()]
    assert rows[0] == "metric" and table.splitlines()[0] == "| metric | model | tfidf |"
    assert rows[2:] == [
        "**STS Benchmark, raw cosine**",
        "stsb/dev/pearson",
        "stsb/dev/news/pearson",
        "stsb/test/pearson",
        "**STS Benchmark, tuned STS matrix**",
        "stsb_tuned/test/pearson",
        "**retrieval**",
        "reddit/p_at_1",
        "reddit/p_at_1_stderr",
        "reddit/p_at_3",
        "reddit/p_at_10",
        "reddit/queries",
        "**classification**",
        "snli/dev/accuracy",
        "**community QA**",
        "cqa2016/map",
    ]
    assert "| reddit/p_at_1 | 0.5000 | 0.3300 |" in table and "| stsb_tuned/test/pearson | 0.8500 | — |" in table
    assert "| reddit/queries | 1000 | — |" in table  # counts are shown whole
    # The console's short table: the headline rows in their order, no group titles.
    short = results_table({"model": model, "tfidf": {"stsb/dev/pearson": 0.74}}, short=True)
    assert [line.split("|")[1].strip() for line in short.splitlines()][2:] == [
        "stsb/dev/pearson",
        "stsb/test/pearson",
        "stsb_tuned/test/pearson",
        "reddit/p_at_1",
        "reddit/p_at_10",
        "snli/dev/accuracy",
        "cqa2016/map",
    ]
    # results.md and the MLflow run's description: the headline rows at the top, then every metric.
    from convsts.ray_jobs.pipelines.evaluate import results_document

    document = results_document({"model": model, "tfidf": {"stsb/dev/pearson": 0.74}})
    assert document.startswith(f"**Headline**\n\n{short}\n\n**All metrics**\n\n| metric | model | tfidf |")
    assert document.endswith(results_table({"model": model, "tfidf": {"stsb/dev/pearson": 0.74}}))


def test_stsb_sample_written_by_pandas_scores_by_genre(sample_checkpoint, tmp_path):
    """An STS-B file that pandas wrote from a sample keeps its row labels; genre metrics use positions."""
    from convsts.ray_jobs.evaluation.scorers import EmbeddingScorer
    from convsts.ray_jobs.evaluation.sts import sts_metrics

    full = read_stsb(stsb_split_path(resolve_path("{sample}"), "dev"))
    sample = full.sample(200, random_state=0)  # labels up to 1,499
    sample.to_parquet(tmp_path / "stsb_dev.parquet")  # index kept in the file
    read = read_stsb(stsb_split_path(tmp_path, "dev"))
    assert list(read.index) == list(range(200))
    scorer = EmbeddingScorer(load(sample_checkpoint))
    metrics = sts_metrics(scorer, read, "stsb/dev")
    assert metrics == sts_metrics(scorer, sample, "stsb/dev")  # the labelled frame scores the same
    assert {f"stsb/dev/{g}/pearson" for g in sample["genre"].unique()} <= metrics.keys()
    # A genre's Pearson is over that genre's rows: the same as scoring them alone.
    news = sample[sample["genre"] == "news"].reset_index(drop=True)
    assert metrics["stsb/dev/news/pearson"] == pytest.approx(sts_metrics(scorer, news, "x")["x/pearson"], abs=1e-9)


def _sts_releases(folder):
    """The same 40 STS-B pairs written the ways STS releases ship: parquet and JSON lines (MTEB),
    SICK's tab-separated table, a comma-separated table with quoting, the STS Benchmark's own
    headerless file, and an STS 2012-2016 input file with its gold file (3 pairs without gold).
    Returns (the 40 pairs, {set name: file name})."""
    pairs = read_stsb(stsb_split_path(resolve_path("{sample}"), "test")).iloc[:40].reset_index(drop=True)
    plain = pairs[["sentence1", "sentence2", "score"]]
    plain.to_parquet(folder / "set_parquet.parquet")
    plain.to_json(folder / "set_jsonl.jsonl", orient="records", lines=True)
    pd.DataFrame(
        {
            "pair_ID": range(1, 41),
            "sentence_A": pairs["sentence1"],
            "sentence_B": pairs["sentence2"],
            "relatedness_score": pairs["score"],
            "entailment_judgment": "NEUTRAL",
        }
    ).to_csv(folder / "SICK_trial.txt", sep="\t", index=False)
    plain.assign(sentence1=plain["sentence1"] + ", and so on").to_csv(folder / "commas.csv", index=False)
    official = [
        "\t".join(
            ["main-captions", "MSRvid", "2012test", f"{i:04d}", f"{r.score:.3f}", r.sentence1, r.sentence2]
            + (["licence", "extra"] if i % 5 == 0 else [])
        )
        for i, r in enumerate(plain.itertuples())
    ]
    (folder / "sts-test.csv").write_text("\n".join(official) + "\n")
    extra = [("a man is cutting a tomato", "a woman plays a flute")] * 3  # gold left empty, as some years' files do
    (folder / "STS.input.demo.txt").write_text(
        "\n".join(f"{a}\t{b}" for a, b in list(zip(plain["sentence1"], plain["sentence2"])) + extra) + "\n"
    )
    (folder / "STS.gs.demo.txt").write_text("\n".join([f"{s:.3f}" for s in plain["score"]] + ["", "", ""]) + "\n")
    files = {
        "set_parquet": "set_parquet.parquet",
        "set_jsonl": "set_jsonl.jsonl",
        "SICK_trial": "SICK_trial.txt",
        "commas": "commas.csv",
        "sts-test": "sts-test.csv",
        f"{folder.name}.demo": "STS.input.demo.txt",
    }
    return plain, files


TUNED_SHORT = ["eval.tuned.epochs=2", "data.cqa_test=''", "data.snli_dev=''"]


def test_other_sts_sets_are_read_as_their_releases_ship_them(tmp_path):
    from convsts.datasets.evalsets import read_sts_file

    plain, files = _sts_releases(tmp_path)
    for name, file in files.items():
        frame = read_sts_file(tmp_path / file)
        assert list(frame.columns) == ["sentence1", "sentence2", "score"], name
        expected = plain.assign(sentence1=plain["sentence1"] + ", and so on") if name == "commas" else plain
        pd.testing.assert_frame_equal(frame, expected, check_exact=False, atol=1e-3, obj=name)
    assert read_sts_file(tmp_path / "STS.input.demo.txt").attrs["without_gold"] == 3


def test_the_same_pairs_score_the_same_in_every_release_format(sample_checkpoint, tmp_path):
    _, files = _sts_releases(tmp_path)
    results = run_evaluation(
        load_config(None, TUNED_SHORT),
        tmp_path / "eval",
        checkpoint=str(sample_checkpoint),
        log_to_mlflow=False,
        sts_files=[str(tmp_path / f) for f in files.values()],
    )
    for kind in ("sts", "sts_tuned"):  # the same pairs score the same in every format; the STS-B matrix applies too
        scores = [results[f"{kind}/{name}/pearson"] for name in files if name != "commas"]
        assert -1 <= scores[0] <= 1 and max(scores) - min(scores) < 1e-6, (kind, scores)
    counts = {results[f"sts_tuned/{name}/pairs"] for name in files if name != "commas"}  # not in STS-B train or dev
    assert len(counts) == 1 and 30 <= counts.pop() <= 40
    assert "other STS sets, STS-B's tuned matrix" in (tmp_path / "eval" / "results.md").read_text()


def test_the_tuned_matrix_is_scored_without_the_pairs_it_was_fitted_on(sample_checkpoint, tmp_path):
    """10 STS-B train pairs (which fit the tuned matrix), re-cased, re-punctuated and swapped, beside
    the 40: the tuned score leaves them out, the raw one does not."""
    plain, _ = _sts_releases(tmp_path)
    seen = read_stsb(stsb_split_path(resolve_path("{sample}"), "train")).iloc[:10]
    swapped = pd.DataFrame(
        {"sentence1": seen["sentence2"].str.upper() + " !", "sentence2": seen["sentence1"], "score": seen["score"]}
    )
    pd.concat([plain, swapped]).to_csv(tmp_path / "overlap.tsv", sep="\t", index=False)
    results = run_evaluation(
        load_config(None, TUNED_SHORT),
        tmp_path / "eval",
        checkpoint=str(sample_checkpoint),
        log_to_mlflow=False,
        sts_files=[str(tmp_path / "overlap.tsv"), str(tmp_path / "set_parquet.parquet")],
    )
    assert results["sts_tuned/overlap/pairs"] == results["sts_tuned/set_parquet/pairs"]
    assert results["sts_tuned/overlap/pearson"] == pytest.approx(results["sts_tuned/set_parquet/pearson"], abs=1e-6)
    assert results["sts/overlap/pearson"] != pytest.approx(results["sts/set_parquet/pearson"], abs=1e-6)  # all 50


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            "trainr.steps=5",
            r"--sts trainr.steps=5: no file 5 to name 'trainr.steps' \(as a config override, "
            r"'trainr.steps' is not a run config key\)",
        ),
        ("gone.tsv", r"--sts .*gone.tsv: no such file"),
    ],
)
def test_an_sts_entry_without_its_file_is_refused_before_the_evaluation_makes_anything(
    sample_checkpoint, tmp_path, entry, message
):
    from convsts.io.errors import BadInputError

    _sts_releases(tmp_path)
    entries = [f"y={tmp_path / 'set_jsonl.jsonl'}", entry if "=" in entry else str(tmp_path / entry)]
    with pytest.raises(BadInputError, match=message):
        run_evaluation(
            load_config(None, TUNED_SHORT),
            tmp_path / "refused",
            checkpoint=str(sample_checkpoint),
            log_to_mlflow=False,
            sts_files=entries,
        )
    assert not (tmp_path / "refused").exists()


def test_sts_sets_are_named_by_their_release_folder_or_their_own_name(tmp_path, monkeypatch):
    from convsts.datasets.evalsets import sts_set_names
    from convsts.io.errors import BadInputError

    # An STS 2012-2016 set is named by its release's folder too (headlines is in STS 2013-2016); other
    # files by their own name, and by their folder's where two share one.
    assert sts_set_names(
        [
            "r/STS13/STS.input.headlines.txt",
            "r/STS14/STS.input.headlines.txt",
            "r/STS14/STS.input.images.txt",
            "a/my_sts.tsv",
            "b/other.tsv",
            "c/other.tsv",
        ]
    ) == {
        "r/STS13/STS.input.headlines.txt": "STS13.headlines",
        "r/STS14/STS.input.headlines.txt": "STS14.headlines",
        "r/STS14/STS.input.images.txt": "STS14.images",
        "a/my_sts.tsv": "my_sts",
        "b/other.tsv": "b.other",
        "c/other.tsv": "c.other",
    }
    with pytest.raises(BadInputError, match="share the name 'STS13.headlines'"):
        sts_set_names(["a/STS13/STS.input.headlines.txt", "b/STS13/STS.input.headlines.txt"])
    # Hugging Face hub shards are named by their split, under the folder above data/; NAME=FILE names a file.
    assert sts_set_names(
        [
            "hub/sts12-sts/data/test-00000-of-00001.parquet",
            "hub/sts13-sts/data/test-00000-of-00001-5e2a1f0c.parquet",
            "s3://bucket/sick/test.parquet?region=x",
            "mine=a/data/test-00000-of-00001.parquet",
        ]
    ) == {
        "hub/sts12-sts/data/test-00000-of-00001.parquet": "sts12-sts.test",
        "hub/sts13-sts/data/test-00000-of-00001-5e2a1f0c.parquet": "sts13-sts.test",
        "s3://bucket/sick/test.parquet?region=x": "sick.test",
        "a/data/test-00000-of-00001.parquet": "mine",
    }
    with pytest.raises(BadInputError, match=r"share the name 'x'.*--sts NAME=FILE"):
        sts_set_names(["x=a.tsv", "x=b.tsv"])
    with pytest.raises(BadInputError, match=r"^a.tsv: given to --sts twice"):
        sts_set_names(["x=a.tsv", "a.tsv"])
    (tmp_path / "odd=name.tsv").write_text("")  # a file whose own name holds "=" is that file
    monkeypatch.chdir(tmp_path)
    assert sts_set_names(["odd=name.tsv"]) == {"odd=name.tsv": "odd=name"}


def test_an_sts_file_that_cannot_be_read_as_scored_pairs_is_refused_naming_it(tmp_path):
    from convsts.datasets.evalsets import read_sts_file
    from convsts.io.errors import BadInputError

    plain = read_stsb(stsb_split_path(resolve_path("{sample}"), "test")).iloc[:40].reset_index(drop=True)
    plain = plain[["sentence1", "sentence2", "score"]]
    (tmp_path / "two_columns.tsv").write_text("a cat sits\ta cat is sitting\n")
    (tmp_path / "STS.input.nogold.txt").write_text("a\tb\n")
    (tmp_path / "STS.input.short.txt").write_text("a\tb\nc\td\n")
    (tmp_path / "STS.gs.short.txt").write_text("3.0\n")
    (tmp_path / "bad_score.tsv").write_text("sentence_A\tsentence_B\trelatedness_score\nx\ty\t4.1\nx\ty\thigh\n")
    # `label` is read as the score where it holds scores (Hugging Face's glue/stsb), refused where it holds classes.
    plain.rename(columns={"score": "label"}).to_json(tmp_path / "glue_stsb.jsonl", orient="records", lines=True)
    pd.testing.assert_frame_equal(read_sts_file(tmp_path / "glue_stsb.jsonl"), plain, check_exact=False, atol=1e-3)
    plain.assign(label=(plain["score"] > 2.5).astype(int)).drop(columns="score").to_parquet(tmp_path / "mrpc.parquet")
    for file, message in (
        ("two_columns.tsv", "two_columns.tsv: no header row naming the sentence and score columns"),
        ("STS.input.nogold.txt", "STS.gs.nogold.txt are not beside it"),
        ("STS.input.short.txt", "STS.gs.short.txt: 1 lines for the 2 pairs"),
        ("bad_score.tsv", "bad_score.tsv: row 2: relatedness_score 'high' is not a number"),
        ("mrpc.parquet", r"mrpc.parquet: its label column holds only the classes \[0, 1\], not similarity"),
    ):
        with pytest.raises(BadInputError, match=message):
            read_sts_file(tmp_path / file)


def test_an_sts_file_of_several_splits_is_scored_whole_and_split_by_split(sample_checkpoint, tmp_path):
    """sentence-transformers' stsbenchmark.tsv.gz ships STS-B's train, dev and test in one table with a
    `split` column, SICK.txt its TRAIN/TRIAL/TEST in `SemEval_set`: each split is scored on its own
    as well (a test split read this way scores as STS-B test does), not only the mix of all."""
    import gzip

    from convsts.datasets.evalsets import pair_keys, read_sts_file

    splits = {split: read_stsb(stsb_split_path(resolve_path("{sample}"), split)) for split in ("train", "dev", "test")}
    table = pd.concat([frame.assign(split=split) for split, frame in splits.items()], ignore_index=True)
    lines = ["split\tgenre\tdataset\tyear\tsid\tscore\tsentence1\tsentence2"]  # unquoted, as it ships
    lines += [
        "\t".join([r.split, r.genre, "MSRvid", "2012test", f"{i:04d}", repr(r.score), r.sentence1, r.sentence2])
        for i, r in enumerate(table.itertuples())
    ]
    with gzip.open(tmp_path / "stsbenchmark.tsv.gz", "wt", encoding="utf-8") as out:
        out.write("\n".join(lines) + "\n")
    test = splits["test"].iloc[:60]
    pd.DataFrame(
        {
            "pair_ID": range(60),
            "sentence_A": test["sentence1"],
            "sentence_B": test["sentence2"],
            "relatedness_score": test["score"],
            "entailment_label": "NEUTRAL",
            "SemEval_set": ["TRIAL"] * 20 + ["TEST"] * 40,
        }
    ).to_csv(tmp_path / "SICK.txt", sep="\t", index=False)
    read = read_sts_file(tmp_path / "stsbenchmark.tsv.gz")
    assert list(read.columns) == ["sentence1", "sentence2", "score", "split"]
    assert read["split"].value_counts().to_dict() == {s: len(f) for s, f in splits.items()}
    odd = pd.DataFrame(
        {
            "sentence1": ["a", "b", "c"],
            "sentence2": ["d", "e", "f"],
            "score": [1.0, 2.0, 3.0],
            "split": ["Test / A", "", "dev"],
        }
    )
    odd.to_csv(tmp_path / "odd.tsv", sep="\t", index=False)  # split names become metric name parts
    assert list(read_sts_file(tmp_path / "odd.tsv")["split"]) == ["test_a", "unnamed", "dev"]

    cfg = load_config(None, ["eval.tuned.epochs=2", "data.cqa_test=''", "data.snli_dev=''"])
    results = run_evaluation(
        cfg,
        tmp_path / "eval",
        checkpoint=str(sample_checkpoint),
        log_to_mlflow=False,
        sts_files=[str(tmp_path / "stsbenchmark.tsv.gz"), str(tmp_path / "SICK.txt")],
    )
    for split in ("dev", "test"):  # the same pairs as STS-B's own files: the same scores
        for stat in ("pearson", "spearman"):
            assert results[f"sts/stsbenchmark/{split}/{stat}"] == pytest.approx(
                results[f"stsb/{split}/{stat}"], abs=1e-6
            )
    assert abs(results["sts/stsbenchmark/pearson"] - results["stsb/test/pearson"]) > 1e-4  # the mix of all three
    assert {"sts/stsbenchmark/train/pearson", "sts/SICK/trial/pearson", "sts/SICK/test/pearson"} <= results.keys()
    # The tuned matrix is scored on pairs it was neither fitted nor selected on: none of train or dev.
    fitted = set(pair_keys(pd.concat([splits["train"], splits["dev"]])))
    fresh_test = sum(key not in fitted for key in pair_keys(splits["test"]))
    assert results["sts_tuned/stsbenchmark/test/pairs"] == results["sts_tuned/stsbenchmark/pairs"] == fresh_test
    assert "sts_tuned/stsbenchmark/train/pearson" not in results and "sts_tuned/stsbenchmark/dev/pearson" not in results
    assert (
        results["sts_tuned/SICK/trial/pairs"] + results["sts_tuned/SICK/test/pairs"] == results["sts_tuned/SICK/pairs"]
    )
    table_md = (tmp_path / "eval" / "results.md").read_text()
    assert (
        table_md.index("| sts/stsbenchmark/pearson")
        < table_md.index("| sts/stsbenchmark/dev/pearson")
        < table_md.index("| sts/stsbenchmark/test/pearson")
        < table_md.index("| sts/stsbenchmark/train/pearson")
    )


def test_cli_evaluates_a_training_runs_model_folder_into_that_run(sample_checkpoint, tmp_path, mlflow_uri):
    """`convsts evaluate --checkpoint OUT/model` (the folder users take away) logs into the run that
    trained it, as OUT/checkpoint does, and re-logs the run's model with the results on its card;
    OUT/best_checkpoint holds other weights and gets a run of its own."""
    import shutil

    from mlflow.tracking import MlflowClient

    from convsts.io.errors import BadInputError
    from convsts.models.checkpoint import save_model_folder
    from convsts.ray_jobs.cli.evaluate import main
    from convsts.ray_jobs.tracking import runs as tracking
    from convsts.ray_jobs.tracking.model_card import CARD_FILE, run_facts, write_card

    run = tmp_path / "run"
    shutil.copytree(sample_checkpoint, run / "checkpoint")
    shutil.copytree(sample_checkpoint, run / "best_checkpoint")
    model = save_model_folder(run / "checkpoint", run / "model")
    run_id = tracking.start_run(mlflow_uri, "convsts", "train")
    write_card(model, run_facts({"name": "tiny", "trainer": {"steps": 0}}, {}, {}, run_id, mlflow_uri, 1.0))
    (run / "train.json").write_text(
        json.dumps(
            {
                "checkpoint": str(run / "checkpoint"),
                "model": str(model),
                "best_checkpoint": str(run / "best_checkpoint"),
                "mlflow_run_id": run_id,
                "tracking_uri": mlflow_uri,
            }
        )
    )
    common = [
        "eval.tuned.epochs=1",
        "data.snli_dev=''",
        "data.snli_test=''",
        "data.cqa_test=''",
        f"mlflow.tracking_uri={mlflow_uri}",
    ]

    assert main(["--checkpoint", str(model), "--out", str(tmp_path / "e_model"), *common]) == 0
    saved = json.loads((tmp_path / "e_model" / "results.json").read_text())
    assert saved["mlflow_run_id"] == run_id
    client = MlflowClient(mlflow_uri)
    logged = client.get_run(run_id).data.metrics
    assert logged["stsb/test/pearson"] == pytest.approx(saved["stsb/test/pearson"])
    # The run's description (what its MLflow page opens on) is the results table.
    note = client.get_run(run_id).data.tags["mlflow.note.content"]
    assert note.startswith("Evaluation of ") and f"| stsb/test/pearson | {saved['stsb/test/pearson']:.4f} |" in note
    card = (model / CARD_FILE).read_text()
    assert card.count(f"| STS Benchmark test, Pearson r (raw cosine) | {saved['stsb/test/pearson']:.4f} |") == 1
    experiment = client.get_run(run_id).info.experiment_id
    assert [m.name for m in client.search_logged_models([experiment]) if m.source_run_id == run_id] == ["model"]

    assert main(["--checkpoint", str(run / "best_checkpoint"), "--out", str(tmp_path / "e_best"), *common]) == 0
    best = json.loads((tmp_path / "e_best" / "results.json").read_text())
    assert best["mlflow_run_id"] != run_id
    assert client.get_run(best["mlflow_run_id"]).data.params["checkpoint"] == str(run / "best_checkpoint")

    # A damaged train.json beside the folder is refused in one line naming it, before --out exists.
    for damaged, message in (
        ("{bad", r"train.json: not JSON \(Expecting"),
        ("[1]", r"train.json: not the JSON object"),
    ):
        (run / "train.json").write_text(damaged)
        with pytest.raises(BadInputError, match=message + r".*restore or delete it to evaluate .*model"):
            main(["--checkpoint", str(model), "--out", str(tmp_path / "e_damaged"), *common])
        assert not (tmp_path / "e_damaged").exists()


def test_compare_pairs_two_evaluations_query_by_query(sample_checkpoint, tmp_path):
    """`convsts evaluate --compare A B`: the P@N difference of two evaluations on the same queries and
    candidates, with the paired standard error; evaluations of other queries are refused in one line."""
    from convsts.io.errors import BadInputError
    from convsts.ray_jobs.cli.evaluate import main
    from convsts.ray_jobs.evaluation.compare import write_items
    from convsts.ray_jobs.evaluation.retrieval import precision_at_n_metrics
    from convsts.ray_jobs.evaluation.scorers import EmbeddingScorer, LexicalScorer

    pairs = pd.read_parquet(resolve_path("{sample}/reddit_pairs.parquet")).head(400)
    pairs = pd.DataFrame({"context": pairs["question"], "response": pairs["answer"]})
    scorers = {
        "model": EmbeddingScorer(load(sample_checkpoint)),
        "tfidf": LexicalScorer("tfidf", list(pairs["context"]) + list(pairs["response"])),
    }
    folders = {}
    for name, scorer in scorers.items():
        for seed in (0, 1):
            metrics, items = precision_at_n_metrics(scorer, pairs, 150, 49, seed, "reddit")
            assert len(items) == 150 and items["rank"].between(1, 50).all()
            assert metrics["reddit/p_at_1"] == pytest.approx(float((items["rank"] == 1).mean()))
            folders[name, seed] = tmp_path / f"{name}{seed}"
            write_items(folders[name, seed] / "items", "reddit", items)
            (folders[name, seed] / "results.json").write_text(json.dumps(metrics))

    assert main(["--compare", str(folders["tfidf", 0]), str(folders["model", 0]), "--out", str(tmp_path / "c")]) == 0
    paired = json.loads((tmp_path / "c" / "compare.json").read_text())
    a, b = (json.loads((folders[k, 0] / "results.json").read_text()) for k in ("tfidf", "model"))
    ranks = [pd.read_parquet(folders[k, 0] / "items" / "reddit.parquet")["rank"].to_numpy() for k in ("tfidf", "model")]
    for n in (1, 3, 10):
        assert paired[f"reddit/p_at_{n}_diff"] == pytest.approx(
            a[f"reddit/p_at_{n}"] - b[f"reddit/p_at_{n}"], abs=1e-12
        )
        d = (ranks[0] <= n).astype(float) - (ranks[1] <= n).astype(float)
        assert paired[f"reddit/p_at_{n}_diff_stderr"] == pytest.approx(d.std(ddof=1) / np.sqrt(150))
    assert paired["reddit/paired_queries"] == 150 and paired["reddit/p_at_1_diff"] > 0  # TF-IDF beats a random DAN
    table = (tmp_path / "c" / "compare.md").read_text()
    assert table.index("| reddit/p_at_1 |") < table.index("| reddit/p_at_3 |") < table.index("| reddit/p_at_10 |")
    assert (
        f"| reddit/p_at_1 | {a['reddit/p_at_1']:.4f} | {b['reddit/p_at_1']:.4f} | {paired['reddit/p_at_1_diff']:+.4f} |"
        in table
    )

    # Another eval.seed drew other queries: refused, naming both folders, nothing written.
    with pytest.raises(BadInputError, match=r"ranked other queries or candidates \(150 and 150 queries"):
        main(["--compare", str(folders["tfidf", 0]), str(folders["model", 1]), "--out", str(tmp_path / "c2")])
    assert not (tmp_path / "c2").exists()
    with pytest.raises(BadInputError, match="no items/ folder"):
        main(["--compare", str(folders["tfidf", 0]), str(tmp_path), "--out", str(tmp_path / "c3")])
    (folders["model", 1] / "items" / "reddit.parquet").write_text("not parquet")
    with pytest.raises(BadInputError, match=r"reddit.parquet: not a parquet file"):
        main(["--compare", str(folders["tfidf", 0]), str(folders["model", 1]), "--out", str(tmp_path / "c5")])
    with pytest.raises(BadInputError, match="--prepared would do nothing"):
        main(
            [
                "--compare",
                str(folders["tfidf", 0]),
                str(folders["model", 0]),
                "--out",
                str(tmp_path / "c4"),
                "--prepared",
                str(tmp_path),
            ]
        )


def test_an_sts_row_whose_gold_is_null_is_left_out_and_counted(tmp_path):
    """JSON null (and a NaN in parquet) is a missing gold score, as an empty one is: left out and
    counted; a score that is text is still refused."""
    from convsts.datasets.evalsets import read_sts_file
    from convsts.io.errors import BadInputError

    rows = [
        {"sentence1": "a man plays", "sentence2": "a man is playing", "score": 4.5},
        {"sentence1": "a cat", "sentence2": "the sky", "score": None},
        {"sentence1": "two dogs", "sentence2": "dogs", "score": 3.0},
    ]
    (tmp_path / "nulls.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    frame = read_sts_file(tmp_path / "nulls.jsonl")
    assert list(frame["score"]) == [4.5, 3.0] and frame.attrs["without_gold"] == 1
    pd.DataFrame(rows).to_parquet(tmp_path / "nulls.parquet")
    assert read_sts_file(tmp_path / "nulls.parquet").attrs["without_gold"] == 1
    rows[1]["score"] = "high"
    (tmp_path / "text.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(BadInputError, match=r"text.jsonl: row 2: score 'high' is not a number"):
        read_sts_file(tmp_path / "text.jsonl")


def test_a_long_results_table_is_cut_at_mlflows_tag_limit_with_a_pointer(mlflow_uri):
    from mlflow.tracking import MlflowClient

    from convsts.ray_jobs.tracking import runs as tracking

    run_id = tracking.start_run(mlflow_uri, "notes", "long-table")
    tracking.describe_run(mlflow_uri, run_id, "\n".join(f"| metric{i} | 0.5000 |" for i in range(2000)))
    note = MlflowClient(mlflow_uri).get_run(run_id).data.tags["mlflow.note.content"]
    assert len(note) <= tracking.NOTE_LIMIT and note.startswith("| metric0 | 0.5000 |\n")
    assert note.endswith("| 0.5000 |\n\n(cut here: the whole table is the artifact results.md)")
