"""Runs given what they cannot use: a used --out, numbers out of range, config errors, numerical
faults, damaged checkpoints, a full disk: one line naming the key or file, nothing half-saved."""

import json
import re
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
import torch
from testkit.faults import run_python, tiny_checkpoint

from convsts.io.errors import BadInputError, ConfigError
from convsts.ray_jobs.config.loader import load_config


def test_a_second_run_into_a_used_out_is_refused_unless_resumed_or_fresh(tmp_path):
    from convsts.ray_jobs.training.lineage import decide_start, remove_earlier_outputs

    cfg = load_config(None, [])
    assert decide_start(tmp_path, cfg).resume_from == ""  # empty: fine
    tiny_checkpoint(tmp_path / "checkpoint")
    (tmp_path / "train.json").write_text("{}")
    with pytest.raises(
        FileExistsError, match="already holds a training run .*checkpoint is .*checkpoint .*; pass --resume latest to"
    ):
        decide_start(tmp_path, cfg)
    resumed = load_config(None, [f"trainer.resume_from={tmp_path / 'checkpoint'}"])
    assert decide_start(tmp_path, resumed).resume_from == str(tmp_path / "checkpoint")
    with pytest.raises(
        ConfigError, match="^--fresh starts over and --resume .* continues a checkpoint: pass one of them$"
    ):
        decide_start(tmp_path, resumed, fresh=True)  # refused, nothing removed
    assert (tmp_path / "checkpoint").is_dir()
    remove_earlier_outputs(decide_start(tmp_path, cfg, fresh=True))
    assert not (tmp_path / "checkpoint").exists() and not (tmp_path / "train.json").exists()


def test_resume_names_what_differs_from_the_checkpoint(tmp_path):
    from convsts.datasets.text import DanTokenizer, count_words
    from convsts.models.checkpoint import build_model, read_meta, save_checkpoint
    from convsts.ray_jobs.training.start_checks import data_mismatches, resume_mismatches

    cfg = load_config(
        None,
        [
            "model.dan.output_dim=6",
            "model.dan.embedding_dim=4",
            "model.dan.hidden_sizes=[4]",
            "tokenizer.bigram_buckets=11",
        ],
    )
    tok = DanTokenizer.build(count_words(["a b c"]), cfg.tokenizer)
    save_checkpoint(
        tmp_path / "c", build_model(cfg.model, tok), tok, cfg.to_dict(), provenance={"data": {"reddit": "aaa"}}
    )
    assert (
        resume_mismatches(read_meta(tmp_path / "c"), cfg)
        == data_mismatches(read_meta(tmp_path / "c"), {"reddit": "aaa"})
        == []
    )
    meta = json.loads((tmp_path / "c" / "config.json").read_text())
    del meta["run_config"]["model"]["symmetric_loss"]  # a checkpoint written before that setting existed
    (tmp_path / "c" / "config.json").write_text(json.dumps(meta))
    assert (
        resume_mismatches(read_meta(tmp_path / "c"), cfg)
        == data_mismatches(read_meta(tmp_path / "c"), {"reddit": "aaa"})
        == []
    )
    other = load_config(
        None,
        [
            "model.dan.output_dim=8",
            "model.dan.embedding_dim=4",
            "model.dan.hidden_sizes=[4]",
            "tokenizer.bigram_buckets=11",
            "tokenizer.word_vocab_size=10",
        ],
    )
    differs = resume_mismatches(read_meta(tmp_path / "c"), other)
    assert "model.dan.output_dim=6 (this run: 8)" in differs
    assert "tokenizer.word_vocab_size=50000 (this run: 10)" in differs
    assert data_mismatches(read_meta(tmp_path / "c"), {"reddit": "bbb"}) == [
        "the prepared reddit data differs from the data the checkpoint was trained on"
    ]


def test_a_checkpoint_without_a_new_builtin_head_resumes_with_that_head_fresh_in_one_line(tmp_path, caplog):
    """Every model has every built-in head; a checkpoint written before a head existed resumes: its
    encoder and the heads it has load, the new head keeps its initial weights, and the driver says so
    in one line. A head of another kind is a difference, refused in the driver's one line."""
    import logging

    from convsts.datasets.text import DanTokenizer, count_words
    from convsts.models.checkpoint import TrainState, build_model, load_weights, read_meta, save_checkpoint
    from convsts.ray_jobs.tasks import model_heads
    from convsts.ray_jobs.training.start_checks import check_resumable, resume_mismatches

    overrides = ["model.dan.output_dim=6", "model.dan.embedding_dim=4", "model.dan.hidden_sizes=[4]"]
    cfg = load_config(None, overrides)
    tok = DanTokenizer.build(count_words(["a b c"]), cfg.tokenizer)
    heads = model_heads(cfg)
    older = dict(list(heads.items())[:-1])  # written before the last built-in head existed
    new_head = list(heads)[-1]
    trained = build_model(cfg.model, tok, older)
    save_checkpoint(tmp_path / "old", trained, tok, cfg.to_dict(), train_state=TrainState(7))
    resumed = load_config(None, [*overrides, f"trainer.resume_from={tmp_path / 'old'}"])
    with caplog.at_level(logging.INFO, logger="convsts"):
        check_resumable(resumed)
    said = [r.getMessage() for r in caplog.records if "head" in r.getMessage()]
    assert said == [f"{tmp_path / 'old'} has no {new_head} head: it starts from its initial weights"]

    model = build_model(cfg.model, tok, heads)
    initial = {k: v.clone() for k, v in model.heads[new_head].state_dict().items()}
    changes = load_weights(model, tmp_path / "old")
    assert changes.fresh == [new_head] and changes.dropped == [] and changes.other_kind == []
    for name, tensor in trained.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    for name, tensor in model.heads[new_head].state_dict().items():
        assert torch.equal(tensor, initial[name]), name

    other = {t: ("response" if kind != "response" else "nli") for t, kind in list(heads.items())[:1]}
    save_checkpoint(tmp_path / "other", build_model(cfg.model, tok, heads | other), tok, cfg.to_dict())
    task = next(iter(other))
    assert resume_mismatches(read_meta(tmp_path / "other"), cfg) == [
        f"the {task}: {heads[task]} (checkpoint: {other[task]})"
    ]


@pytest.mark.parametrize(
    "override, key",
    [
        ("trainer.steps=-5", "trainer.steps"),
        ("trainer.stages=[{start_step: 0, batch_size: 0, lr: 0.01}]", "trainer.stages[0].batch_size"),
        ("trainer.stages=[{start_step: 0, batch_size: 8, lr: -1}]", "trainer.stages[0].lr"),
        ("trainer.stages=[{start_step: 0, batch_size: 8, lr: .nan}]", "trainer.stages[0].lr"),
        ("trainer.task_weights={reddit: .nan, snli: 0.05}", "trainer.task_weights.reddit"),
        ("trainer.task_weights={reddit: .inf, snli: 0.05}", "trainer.task_weights.reddit"),
        ("trainer.task_weights={reddit: 0, snli: 0.05}", "trainer.task_weights.reddit"),
        ("trainer.log_every=0", "trainer.log_every"),
        ("trainer.checkpoint_every=0", "trainer.checkpoint_every"),
        ("trainer.eval_every=-1", "trainer.eval_every"),
        ("trainer.cpus_per_worker=0", "trainer.cpus_per_worker"),
        ("trainer.torch_threads=-1", "trainer.torch_threads"),
        ("trainer.grad_clip=-1", "trainer.grad_clip"),
        ("model.dan.output_dim=0", "model.dan.output_dim"),
        ("model.dan.hidden_sizes=[16, 0]", "model.dan.hidden_sizes[1]"),
        ("model.transformer.num_heads=3", "model.transformer.hidden_size"),
        ("tokenizer.max_words=0", "tokenizer.max_words"),
        ("data.rows_per_shard=0", "data.rows_per_shard"),
    ],
)
def test_out_of_range_numbers_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=re.escape(f"config key '{key}'")):
        load_config(None, [override])


@pytest.mark.parametrize(
    "overrides, said",
    [
        (["trainer.feed=spark"], "'trainer.feed': must be ray_data|local, got 'spark'"),
        (["trainer.feed=local", "trainer.cpus_per_worker=2", "trainer.feed_processes=3"],
         "'trainer.feed_processes': must be at most the worker's CPUs (trainer.cpus_per_worker=2), got 3"),
        (["trainer.feed_processes=1"], "'trainer.feed_processes': must be 0 with trainer.feed=ray_data"),
    ],
)  # fmt: skip
def test_a_feed_setting_it_cannot_use_is_refused_in_one_line_naming_the_key(overrides, said):
    """trainer.feed is one of the two feeds; the local feed's processes are at most the worker's CPUs
    (each is queued two units ahead), and do nothing with the Ray Data feed, so they are refused there."""
    with pytest.raises(ConfigError, match=re.escape(said)):
        load_config(None, overrides)
    assert load_config(None, ["trainer.feed=local", "trainer.cpus_per_worker=2", "trainer.feed_processes=2"])


def test_zero_steps_is_allowed_and_means_untrained():
    assert load_config(None, ["trainer.steps=0"]).trainer.steps == 0


CONFIG_ERRORS = {
    "yaml_list": "the top level must be a mapping",
    "unknown_key": "config key 'trainer.stepz'",
    "bad_number": "config key 'trainer.steps': must be >= 0",
}


@pytest.mark.parametrize(
    "entry, case, expected", [(["-m", "convsts", "train"], case, expected) for case, expected in CONFIG_ERRORS.items()]
)
def test_config_errors_print_one_line_without_traceback(tmp_path, entry, case, expected):
    config = tmp_path / "c.yaml"
    config.write_text(
        {"yaml_list": "- a\n- b\n", "unknown_key": "trainer:\n  stepz: 3\n", "bad_number": "trainer:\n  steps: -5\n"}[
            case
        ]
    )
    result = run_python(*entry, "--config", str(config), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    if case == "yaml_list":  # --debug shows the traceback (one case is enough: a subprocess costs seconds)
        debug = run_python(*entry, "--config", str(config), "--out", str(tmp_path / "out"), "--debug")
        assert "Traceback" in debug.stderr


def test_nan_scores_give_nan_metrics_never_a_perfect_score():
    from convsts.ray_jobs.evaluation import metrics as M

    scores = np.array([[np.nan, 0.1, 0.2], [0.9, 0.1, 0.2]])
    assert all(np.isnan(v) for v in M.precision_at_n(scores, (1, 3)).values())
    assert np.isnan(M.accuracy(np.array([[np.nan, 0.0, 0.0]]), [0]))
    assert np.isnan(M.average_precision([np.nan, 0.5], [True, False]))
    assert np.isnan(M.pearson([1.0, np.nan, 3.0], [1, 2, 3])) and np.isnan(M.spearman([1.0, np.nan, 3.0], [1, 2, 3]))


def test_nan_embeddings_make_the_retrieval_and_sts_metrics_nan():
    from convsts.datasets.config import TokenizerConfig
    from convsts.datasets.text import DanTokenizer, count_words
    from convsts.models.checkpoint import build_model
    from convsts.models.config import DanConfig, ModelConfig
    from convsts.models.sentence_encoder import SentenceEncoder
    from convsts.ray_jobs.evaluation.retrieval import precision_at_n_metrics
    from convsts.ray_jobs.evaluation.scorers import EmbeddingScorer
    from convsts.ray_jobs.evaluation.sts import sts_metrics

    texts = [f"sentence {i} about thing {i % 5}" for i in range(30)]
    tok = DanTokenizer.build(count_words(texts), TokenizerConfig(bigram_buckets=101))
    model = build_model(ModelConfig(dan=DanConfig(embedding_dim=8, hidden_sizes=[8], output_dim=6)), tok).eval()
    with torch.no_grad():
        model.encoder.dnn[0].weight[0, 0] = float("nan")  # a diverged model
    scorer = EmbeddingScorer(SentenceEncoder(model, tok, {}))
    pairs = pd.DataFrame({"context": texts, "response": texts[::-1]})
    p, items = precision_at_n_metrics(scorer, pairs, 10, 9, 0, "reddit")
    assert p.pop("reddit/queries") == 10 and all(np.isnan(v) for v in p.values()), p  # P@N and its stderr
    assert len(items) == 10 and items["rank"].isna().all()  # no rank either: nothing to compare on
    frame = pd.DataFrame({"sentence1": texts[:10], "sentence2": texts[10:20], "score": np.arange(10.0) / 2})
    assert np.isnan(sts_metrics(scorer, frame, "stsb/dev", by_genre=False)["stsb/dev/pearson"])


def test_a_nan_loss_stops_training_naming_the_step_and_task_and_saves_nothing():
    import test_training_core as core

    from convsts.ray_jobs.training.loop import LoopHooks, NonFiniteLossError

    cfg = load_config(
        None,
        core.TINY
        + [
            "trainer.task_weights={snli: 1.0}",
            "trainer.steps=8",
            "trainer.log_every=4",
            "trainer.checkpoint_every=4",
            "trainer.stages=[{start_step: 0, batch_size: 4, lr: 0.001}]",
        ],
    )
    saved = []
    loop, _, _ = core._loop(
        cfg, hooks=LoopHooks(checkpoint=lambda step, m, s: saved.append(step), progress=lambda line: None)
    )
    loop.tasks["snli"] = core.snli_with_nan_loss_at(3)
    with pytest.raises(NonFiniteLossError, match="non-finite snli loss .* at step 3"):
        loop.run()
    assert saved == []  # the step-4 checkpoint of a diverged model was never written


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.pop("model"), r"config.json: model: expected an object, got NoneType"),
        (lambda m: m["model"].pop("nli_hidden"), r"config.json: model.nli_hidden: missing"),
        (lambda m: m["model"].update(colour=1), r"config.json: model.colour: not a key of ModelConfig"),
        (
            lambda m: m["model"]["dan"].update(output_dim="6"),
            r"config.json: model.dan.output_dim: expected int, got '6'",
        ),
        # A size that would allocate gigabytes is refused before anything is built.
        (
            lambda m: m["model"]["dan"].update(hidden_sizes=[4, 1e7]),
            r"model.dan.hidden_sizes\[1\]: expected int, got 1",
        ),
        (
            lambda m: m["model"]["dan"].update(hidden_sizes=[4, 10**7]),
            r"model.dan.hidden_sizes\[1\]: 10000000 is not a",
        ),
    ],
)
def test_damaged_checkpoint_metadata_is_one_line_naming_the_key_before_anything_is_built(tmp_path, edit, message):
    from convsts.models.checkpoint import load_model, write_manifest

    checkpoint = tiny_checkpoint(tmp_path / "c")
    load_model(checkpoint)  # intact: loads
    meta = json.loads((checkpoint / "config.json").read_text())
    edit(meta)
    (checkpoint / "config.json").write_text(json.dumps(meta))
    write_manifest(checkpoint)  # written whole so, as by another program: the manifest matches
    with pytest.raises(BadInputError, match=message) as refused:
        load_model(checkpoint)
    assert "\n" not in str(refused.value) and "the checkpoint is damaged" in str(refused.value)


def test_a_damaged_train_state_is_one_line_in_the_driver(tmp_path):
    from convsts.models.checkpoint import load_train_state

    checkpoint = tiny_checkpoint(tmp_path / "c")
    assert load_train_state(checkpoint).step == 3
    state = checkpoint / "train_state.pt"
    state.write_bytes(state.read_bytes()[:40])  # cut short
    with pytest.raises(BadInputError, match=r"train_state.pt: not a train state this version reads \(\w+\)"):
        load_train_state(checkpoint)
    torch.save({"step": 3, "run": Fraction(1, 3)}, state)  # an object weights_only will not build
    with pytest.raises(BadInputError, match="not a train state this version reads") as refused:
        load_train_state(checkpoint)
    assert "weights_only" not in str(refused.value)  # not torch's advice to load it unsafely
    torch.save({"position": 3}, state)
    with pytest.raises(BadInputError, match="no int 'step'"):
        load_train_state(checkpoint)


def test_a_full_disk_is_one_line_naming_the_file_even_under_the_error_it_caused(tmp_path):
    """ENOSPC (here: /dev/full, a device that is always full) prints one line and exits 2, also when a
    store's write failed while handling it."""
    code = (
        "import shutil, sqlite3, sys\n"
        "from convsts.ray_jobs.runtime.entry import run_main\n"
        "def main(argv):\n"
        "    try:\n"
        "        shutil.copyfile(sys.executable, '/dev/full')\n"
        "    except OSError:\n"
        "        raise sqlite3.OperationalError('database or disk is full')\n"
        "raise SystemExit(run_main('x', main, []))\n"
    )
    result = run_python("-c", code)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    # shutil's write names no file; the library's own writes do (storage.write_errors, below).
    assert lines[0].startswith("convsts x: [Errno 28] No space left on device")


def test_a_write_that_fails_on_a_full_disk_names_its_file(tmp_path, capsys):
    """A write() or close() that fails for space says only "No space left on device": storage.write_errors
    names the file (here a real ENOSPC from /dev/full), and run_main prints it in one line."""
    from convsts.io import storage
    from convsts.ray_jobs.runtime.entry import run_main

    def main(argv):
        with storage.write_errors(tmp_path / "out" / "results.json"), open("/dev/full", "wb") as full:
            full.write(b"x" * 65536)

    assert run_main("x", main, []) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and line.startswith("convsts x: [Errno 28] No space left on device")
    assert str(tmp_path / "out" / "results.json") in line


def test_a_checkpoint_that_does_not_fit_names_the_file_and_leaves_no_part_of_it(tmp_path):
    """Checkpoint files are serialized in memory and written by storage.write_bytes (safetensors' and
    torch's own writers raise errors that name no file, torch's without saying it is space). Here no
    file over 4 kB may be written (RLIMIT_FSIZE: EFBIG, a limit like a full disk): the error names
    the weights file, and no partial file is left."""
    import resource
    import signal

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(OSError, match="File too large") as caught:
            tiny_checkpoint(tmp_path / "ckpt", embedding_dim=256)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert caught.value.filename == str(tmp_path / "ckpt" / "model.safetensors")
    assert list((tmp_path / "ckpt").iterdir()) == []


def test_a_linked_checkpoint_folder_takes_the_final_checkpoint_and_fresh_removes_only_the_link(tmp_path, caplog):
    """OUT/checkpoint a link to a folder on another disk: the final copy of a run that goes on is
    placed whole into the folder the link points to (the link stays, nothing is left beside either);
    `--fresh` removes OUT's outputs all together and the link as a link, keeping the folder it points to."""
    import logging
    from pathlib import Path

    from ray.train import Checkpoint as RayCheckpoint

    from convsts.models.checkpoint import Checkpoint
    from convsts.ray_jobs.training.driver import _copy_whole
    from convsts.ray_jobs.training.lineage import decide_start, remove_earlier_outputs

    out, elsewhere = tmp_path / "out", tmp_path / "disk" / "kept"
    tiny_checkpoint(elsewhere)  # step 3
    out.mkdir()
    (out / "checkpoint").symlink_to(elsewhere, target_is_directory=True)
    (out / "train.json").write_text("{}")
    newer = tiny_checkpoint(tmp_path / "ray" / "checkpoint_850", embedding_dim=5)
    _copy_whole(RayCheckpoint.from_directory(str(newer)), out / "checkpoint")
    assert (out / "checkpoint").is_symlink() and (out / "checkpoint").resolve() == elsewhere.resolve()
    assert sorted(p.name for p in elsewhere.iterdir()) == sorted(p.name for p in Path(newer).iterdir())
    assert (elsewhere / "model.safetensors").read_bytes() == (Path(newer) / "model.safetensors").read_bytes()
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "train.json"]  # no stray link or copy
    assert [p.name for p in elsewhere.parent.iterdir()] == ["kept"]
    with caplog.at_level(logging.INFO, logger="convsts"):
        remove_earlier_outputs(decide_start(out, load_config(None, []), fresh=True))
    assert list(out.iterdir()) == []
    assert Checkpoint.at(elsewhere).step == 3  # the folder the link pointed to, whole
    said = [r.getMessage() for r in caplog.records if "was a link" in r.getMessage()]
    assert said == [
        f"--fresh: {out / 'checkpoint'} was a link: the link removed, the folder it points to kept ({elsewhere.resolve()})"
    ]


def test_the_final_checkpoint_is_placed_whole_or_not_at_all(tmp_path):
    """A copy that fails half-way (here: no file over 4 kB may be written, RLIMIT_FSIZE's soft limit,
    so the 64 kB weights fail as on a full disk) leaves the earlier checkpoint whole and nothing beside
    it; a copy that succeeds replaces it whole."""
    import resource
    import signal

    from ray.train import Checkpoint

    from convsts.ray_jobs.training.driver import _copy_whole

    source, target = tmp_path / "ray" / "checkpoint_1", tmp_path / "out" / "checkpoint"
    source.mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (source / "model.safetensors").write_bytes(b"n" * 65536)
    target.mkdir(parents=True)
    (target / "model.safetensors").write_bytes(b"old weights")
    (target / "old_only.txt").write_text("from the earlier run")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(OSError, match="File too large"):
            _copy_whole(Checkpoint.from_directory(str(source)), target)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert (target / "model.safetensors").read_bytes() == b"old weights"  # the earlier one, whole
    assert sorted(p.name for p in target.parent.iterdir()) == ["checkpoint"]  # no half copy beside it
    _copy_whole(Checkpoint.from_directory(str(source)), target)
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["checkpoint"]


def test_a_missing_file_or_checkpoint_folder_says_it_is_not_there(tmp_path):
    """Not only the path (pyarrow's FileNotFoundError is the path alone), and not a missing
    config.json for a folder that is not there at all."""
    from convsts.datasets import snli
    from convsts.models.checkpoint import read_meta

    with pytest.raises(FileNotFoundError, match=r"none\.parquet: no such file or folder$"):
        snli.read_snli(tmp_path / "none.parquet")
    with pytest.raises(FileNotFoundError, match=r"nothing: no such checkpoint folder$"):
        read_meta(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"is not a convsts checkpoint: .*config\.json is missing"):
        read_meta(tmp_path / "empty")


def test_a_warm_start_that_does_not_fit_the_model_is_refused_in_the_driver(tmp_path):
    from convsts.io.errors import ConfigError
    from convsts.ray_jobs.training.start_checks import check_warm_start

    dan = tiny_checkpoint(tmp_path / "dan")  # a DAN, embedding_dim 4
    other = load_config(None, [f"trainer.warm_start={dan}", "model.encoder=transformer"])
    with pytest.raises(
        ConfigError, match=f"trainer.warm_start: {dan} holds a dan encoder; this run's model.encoder is transformer"
    ):
        check_warm_start(other)
    wider = load_config(None, [f"trainer.warm_start={dan}", "model.dan.output_dim=6", "model.dan.embedding_dim=8",
                               "model.dan.hidden_sizes=[4]"])  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"its encoder's .*embedding.weight is \(\d+, 4\), this run's model makes \(\d+, 8\)"
    ):
        check_warm_start(wider)
    check_warm_start(load_config(None, [f"trainer.warm_start={dan}", "model.dan.output_dim=6", "model.dan.embedding_dim=4",
                                        "model.dan.hidden_sizes=[4]"]))  # fmt: skip


def test_a_list_where_a_mapping_is_expected_names_the_key():
    from convsts.io.errors import ConfigError

    with pytest.raises(ConfigError, match=r"config key 'trainer.task_weights': expected a mapping \({key: value"):
        load_config(None, ["trainer.task_weights=[1,2]"])


def test_a_checkpoint_config_is_held_to_the_run_configs_size_rules():
    """One rule set for the architecture: a config.json whose Transformer no run would build (hidden
    size not a multiple of the heads) is refused at load, as the run config refuses it."""
    import dataclasses

    from convsts.io.errors import ConfigError
    from convsts.models.checkpoint import model_config_from_dict
    from convsts.models.config import ModelConfig

    meta = dataclasses.asdict(ModelConfig(encoder="transformer"))
    meta["transformer"].update(num_heads=3, hidden_size=64)
    with pytest.raises(ValueError, match=r"'model.transformer.hidden_size': must be a multiple of .*num_heads \(3\)"):
        model_config_from_dict(meta)
    with pytest.raises(ConfigError, match=r"'model.transformer.hidden_size': must be a multiple"):
        load_config(None, ["model.transformer.num_heads=3", "model.transformer.hidden_size=64"])


def test_ctrl_c_during_the_final_copy_leaves_the_earlier_checkpoint(tmp_path):
    """A real SIGINT (Python's own handler, which the training command keeps through Ray Train's
    fit) while the final checkpoint is being written: the earlier OUT/checkpoint stays whole, no
    half copy beside it, and the interrupt goes on to the command (exit 130, one line)."""
    import os
    import signal

    from convsts.io.folders import replaced_whole

    target = tmp_path / "out" / "checkpoint"
    target.mkdir(parents=True)
    (target / "model.safetensors").write_bytes(b"old weights")
    # Python's own handler, as a command starts with it (pytest run as a background job of a shell
    # without job control starts with SIGINT ignored instead).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with replaced_whole(target) as partial:
                (partial / "model.safetensors").write_bytes(b"new weights, half")
                os.kill(os.getpid(), signal.SIGINT)
                (partial / "config.json").write_text("{}")  # never reached
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sorted(p.name for p in target.iterdir()) == ["model.safetensors"]
    assert (target / "model.safetensors").read_bytes() == b"old weights"
    assert sorted(p.name for p in target.parent.iterdir()) == ["checkpoint"]


@pytest.mark.slow
@pytest.mark.parametrize("refused", ["trainer.warm_start={missing}", "trainer.num_workers=64"])
def test_fresh_that_cannot_fit_or_warm_start_deletes_nothing(ray_session, tmp_path, refused):
    """`--fresh` over an earlier run, refused for a warm start that is not there or a layout no node
    holds: every refusal comes before the actions, so OUT's checkpoints, run.json and config.yaml
    stay as they were and MLflow is not touched (its store is not even created)."""
    from convsts.ray_jobs.training.driver import run_training

    out = tmp_path / "out"
    tiny_checkpoint(out / "checkpoint")
    (out / "train.json").write_text("{}")
    (out / "config.yaml").write_text("name: the earlier run\n")
    before = sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*"))
    store = tmp_path / "mlflow.db"
    cfg = load_config(None, [refused.format(missing=tmp_path / "no-such-checkpoint"), "trainer.steps=4"])
    with pytest.raises((ConfigError, FileNotFoundError, BadInputError)) as err:
        run_training(cfg, out, prepared_dir=tmp_path / "prepared", fresh=True, mlflow_uri=f"sqlite:///{store}")
    assert ("no-such-checkpoint" if "warm_start" in refused else "do not fit") in str(err.value)
    assert sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*")) == before
    assert not store.exists()


def test_a_resume_that_changes_settings_outside_the_checks_names_them_in_one_line(tmp_path, caplog):
    """Another seed or trainer.steps is taken (raising the steps is how a finished run goes on), and
    named in one line; where the run resumes from and where it logs are not named."""
    import logging

    from convsts.ray_jobs.training.start_checks import check_resumable

    checkpoint = tiny_checkpoint(tmp_path / "c")
    model = ["model.dan.output_dim=6", "model.dan.embedding_dim=4", "model.dan.hidden_sizes=[4]"]
    steps = load_config(None).trainer.steps
    for overrides, said in [
        (["mlflow.experiment=elsewhere"], []),
        (
            [f"trainer.steps={steps + 10}", "seed=7"],
            [
                f"resuming {checkpoint} with other settings than its run's: seed=0 (this run: 7); "
                f"trainer.steps={steps} (this run: {steps + 10})"
            ],
        ),
    ]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="convsts"):
            check_resumable(load_config(None, [*model, *overrides, f"trainer.resume_from={checkpoint}"]))
        assert [r.getMessage() for r in caplog.records if "other settings" in r.getMessage()] == said


def test_a_resume_on_other_data_is_refused_before_a_missing_task_is_prepared_or_ray_starts(tmp_path):
    """A resume whose prepared Reddit data is not what its checkpoint was trained on, into a folder
    that lacks the SNLI data: refused in one line before the missing task is prepared (which can be a
    full prepare of the paper's data), before Ray starts (this tier fails a test that starts it), and
    before OUT or the MLflow store exists."""
    import shutil

    from testkit.tiny import SAMPLE_PREPARE, TINY_DAN

    from convsts.models.checkpoint import TrainState, build_model, save_checkpoint
    from convsts.ray_jobs.pipelines.inputs import ensure_prepared, prepare_all
    from convsts.ray_jobs.training.driver import run_training
    from convsts.ray_jobs.training.tokenizer_fit import build_tokenizer

    prepared, out, store = tmp_path / "prepared", tmp_path / "runs" / "out", tmp_path / "mlflow.db"
    cfg = load_config(None, [*TINY_DAN, "trainer.steps=4"])
    prepare_all(load_config(None, SAMPLE_PREPARE), str(prepared))
    tokenizer = build_tokenizer(cfg, str(prepared))
    shutil.rmtree(prepared / "snli")  # a task this folder lacks
    checkpoint = save_checkpoint(
        tmp_path / "checkpoint",
        build_model(cfg.model, tokenizer),
        tokenizer,
        cfg.to_dict(),
        train_state=TrainState(2),
        provenance={"data": {"reddit": "the digest of other data"}},
    )
    resumed = load_config(None, [*TINY_DAN, "trainer.steps=4", f"trainer.resume_from={checkpoint}"])
    with pytest.raises(
        ConfigError, match="the prepared reddit data differs from the data the checkpoint was trained on"
    ):
        run_training(
            resumed, out, prepared_dir=prepared, mlflow_uri=f"sqlite:///{store}", prepare_missing=ensure_prepared
        )
    assert not (prepared / "snli").exists() and not store.exists()
    assert not out.exists() and not out.parent.exists()  # the folders made for the run went with its refusal


def test_the_checks_before_a_resume_read_its_optimizer_state_and_weights_no_more_than_their_hash(tmp_path):
    """A resume's checks and the driver's tokenizer read what they must, once: the files are hashed
    against the manifest (a read of every byte), then the train state is checked readable with its
    tensors mapped, not read, and the tokenizer taken without loading the weights (the workers load
    both). Bytes read are the process's own count (/proc/self/io rchar), not a timing."""
    from pathlib import Path

    import torch

    from convsts.models.checkpoint import TrainState, load_model, save_checkpoint, verified_folder
    from convsts.ray_jobs.training.driver import _tokenizer
    from convsts.ray_jobs.training.start_checks import check_resumable

    def read_so_far() -> int:
        return int(dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())["rchar"])

    model = ["model.dan.output_dim=6", "model.dan.embedding_dim=4", "model.dan.hidden_sizes=[4]"]
    small = tiny_checkpoint(tmp_path / "small")
    loaded = load_model(small)
    big_state = TrainState(3, [{"exp_avg": torch.zeros(16, 2**20)}])  # 64 MiB of optimizer state
    run_config = json.loads((Path(small) / "config.json").read_text())["run_config"]
    checkpoint = save_checkpoint(tmp_path / "big", loaded.model, loaded.tokenizer, run_config, big_state)
    warm = load_config(None, [*model, f"trainer.resume_from={small}"])
    check_resumable(warm)  # every module imported before the count
    _tokenizer(warm, str(tmp_path))
    cfg = load_config(None, [*model, f"trainer.resume_from={checkpoint}"])
    verified_folder(checkpoint)  # the hash: every byte once
    before = read_so_far()
    check_resumable(cfg)
    _tokenizer(cfg, str(tmp_path))
    assert read_so_far() - before < 4 * 2**20, read_so_far() - before  # the small files, not the state
