"""Mined hard negatives: the mining rule on known embeddings, the Reddit loss over them, and
`convsts mine-negatives` -> training on its folder through Ray Train."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from testkit.frames import frame_batch
from testkit.tiny import TINY_DAN

from convsts.datasets.negatives import MiningConfig, mine
from convsts.datasets.text import DanTokenizer, count_words, encode_columns
from convsts.io.errors import BadInputError
from convsts.models.checkpoint import build_model
from convsts.models.losses import in_batch_softmax_loss
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.tasks import get_task, model_heads
from convsts.ray_jobs.tasks.base import fields
from convsts.ray_jobs.tasks.prepared_folder import verify_prepared
from convsts.ray_jobs.training.train_step import seed_everything


def _ranked(n: int) -> tuple:
    """n pairs whose context 0 scores response j at 1 - j/n (its own, j = 0, best), other contexts alike."""
    context = torch.eye(n)  # (n, n)
    scores = torch.stack([torch.roll(1.0 - torch.arange(n) / n, i) for i in range(n)])  # (n, n): row i peaks at i
    return context, scores.T.contiguous()  # response[j] . context[i] = scores[i, j]


def test_mining_draws_from_the_rank_window_below_the_margin():
    context, response = _ranked(50)
    picked = mine(context, response, MiningConfig(range_min=2, range_max=6, seed=1))
    # Row i's candidates by score: i+1, i+2, ... (mod 50); ranks 2..5 are i+3 .. i+6.
    offsets = (picked - np.arange(50)) % 50
    assert set(offsets.tolist()) <= {3, 4, 5, 6} and len(set(offsets.tolist())) > 1  # drawn, not always the same
    np.testing.assert_array_equal(picked, mine(context, response, MiningConfig(range_min=2, range_max=6, seed=1)))
    assert not np.array_equal(picked, mine(context, response, MiningConfig(range_min=2, range_max=6, seed=2)))
    # A margin of 4.5/50 below the true response's score skips ranks 0..3 (offsets 1..4): in the
    # window of ranks 0..5, only offsets 5 and 6 remain.
    kept = (mine(context, response, MiningConfig(range_min=0, range_max=6, margin=4.5 / 50)) - np.arange(50)) % 50
    assert set(kept.tolist()) <= {5, 6}
    # No candidate left in the window: -1, for the caller to count.
    none = mine(context, response, MiningConfig(range_min=0, range_max=4, margin=4.5 / 50))
    assert (none == -1).all()
    with pytest.raises(ValueError, match="range_min < range_max"):
        mine(context, response, MiningConfig(range_min=5, range_max=5))


def test_mine_negatives_refuses_bad_options_in_one_line(capsys, tmp_path):
    from convsts.ray_jobs.cli.mine import main as mine_main

    common = ["--checkpoint", str(tmp_path), "--prepared", str(tmp_path), "--out", str(tmp_path / "o")]
    for bad, message in (
        (["--range-min", "5", "--range-max", "5"], "need 0 <= --range-min < --range-max, got 5, 5"),
        (["--pairs", "-1"], "--pairs: must be >= 0"),
        (["--workers", "2", "--cpus-per-worker", "0"], "need --workers >= 0, --cpus-per-worker > 0"),
        (["--gpus-per-worker", "1"], "--gpus-per-worker is for a pool: give --workers N too"),
    ):
        with pytest.raises(SystemExit) as exit_:
            mine_main(common + bad)
        assert exit_.value.code == 2 and message in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "o").exists()


def test_reddit_loss_runs_over_the_batch_responses_and_its_negatives():
    cfg = load_config(None, TINY_DAN + ["data.reddit_hard_negatives=true"])
    rows = pd.DataFrame(
        {
            "context": [f"question {i} about topic {i % 5}" for i in range(8)],
            "response": [f"answer {i} on topic {i % 5}" for i in range(8)],
            "negative": [f"answer {(i + 3) % 8} on topic {(i + 3) % 5}" for i in range(8)],
        }
    )
    tokenizer = DanTokenizer.build(count_words(rows.to_numpy().ravel().tolist()), cfg.tokenizer)
    seed_everything(0)
    model = build_model(cfg.model, tokenizer, model_heads(cfg))
    model.heads["reddit"].net[-1].weight.data.normal_()  # a response side that is not the identity
    task = get_task("reddit")
    assert task.text_columns(cfg) == {"context": "context", "response": "response", "negative": "negative"}
    assert "negative" not in task.text_columns(load_config(None, TINY_DAN))  # off by default
    # The single-process feed (benches, tests) tokenizes the run's columns as the workers' feed does.
    batch = frame_batch(tokenizer, task, rows, 16, cfg=cfg)
    ids = encode_columns(tokenizer, {c: rows[c].to_numpy() for c in rows}, task.text_columns(cfg), 16)
    assert batch.keys() == ids.keys() and all(torch.equal(batch[k], torch.from_numpy(v)) for k, v in ids.items())
    assert not any(k.startswith("negative__") for k in frame_batch(tokenizer, task, rows, 16))
    loss, _ = task.loss(model, batch)
    context = model.encode(fields(batch, "context"))  # (8, D)
    response = model.heads["reddit"](model.encode(fields(batch, "response")))  # (8, D)
    negative = model.heads["reddit"](model.encode(fields(batch, "negative")))  # (8, D)
    scale = cfg.model.score_scale
    assert loss.item() == pytest.approx(
        in_batch_softmax_loss(context, response, scale, negatives=negative).item(), rel=1e-5
    )
    assert loss.item() > in_batch_softmax_loss(context, response, scale).item()  # more candidates, more loss
    plain, _ = task.loss(model, {k: v for k, v in batch.items() if not k.startswith("negative__")})
    assert plain.item() == pytest.approx(in_batch_softmax_loss(context, response, scale).item(), rel=1e-5)


@pytest.mark.slow
def test_mine_negatives_writes_a_prepared_folder_that_trains_through_ray_train(ray_session, sample_prepared, tmp_path):
    from convsts.models.checkpoint import save_checkpoint
    from convsts.ray_jobs.cli.mine import main as mine_main
    from convsts.ray_jobs.training.driver import run_training
    from convsts.ray_jobs.training.tokenizer_fit import build_tokenizer

    base = TINY_DAN + [
        "trainer.log_every=1",
        "trainer.checkpoint_every=2",
        f"mlflow.tracking_uri=sqlite:///{tmp_path / 'm.db'}",
    ]
    cfg = load_config(None, base)
    prepared = sample_prepared
    seed_everything(0)
    tokenizer = build_tokenizer(cfg, str(prepared))
    untrained = tmp_path / "untrained"  # the model a run with trainer.steps=0 saves
    save_checkpoint(untrained, build_model(cfg.model, tokenizer, model_heads(cfg)), tokenizer, cfg.to_dict())
    mined = tmp_path / "mined"
    assert (
        mine_main(
            [
                "--checkpoint",
                str(untrained),
                "--prepared",
                str(prepared),
                "--out",
                str(mined),
                "--range-min",
                "1",
                "--range-max",
                "20",
            ]
        )
        == 0
    )
    manifest = json.loads((mined / "reddit" / "manifest.json").read_text())
    source = json.loads((prepared / "reddit" / "manifest.json").read_text())
    info = manifest["negatives"]
    assert info["of_train_pairs"] == source["train_pairs"] == info["sampled_pairs"]
    assert (
        info["mined_pairs"] + info["without_negative"]
        == info["sampled_pairs"]
        == manifest["train_pairs"] + info["without_negative"]
    )
    assert (info["range_min"], info["range_max"], info["margin"], info["checkpoint"]) == (1, 20, None, str(untrained))
    train = pd.read_parquet(mined / "reddit" / "train")
    assert len(train) == info["mined_pairs"] > 0 and {"context", "response", "negative"} <= set(train.columns)
    assert (train["negative"] != train["response"]).all() and train["negative"].isin(train["response"]).all()
    # The other task and the Reddit test split are copied as they are; the folder passes the same checks.
    # The copy's manifest is the source's but for the shard times, the copies' own: a run's check
    # takes them as written and reads none of them again.
    copied, original = (json.loads((root / "snli" / "manifest.json").read_text()) for root in (mined, prepared))
    assert {**copied, "shard_times": None} == {**original, "shard_times": None}
    assert copied["shard_times"] == {
        "train": {p.name: p.stat().st_mtime_ns for p in (mined / "snli" / "train").glob("*.parquet")}
    }
    assert copied["shard_times"] != original["shard_times"]
    assert sorted(p.name for p in (mined / "reddit" / "test").iterdir()) == sorted(
        p.name for p in (prepared / "reddit" / "test").iterdir()
    )
    verify_prepared(get_task("reddit"), str(mined))
    with pytest.raises(FileExistsError, match="not empty"):
        mine_main(["--checkpoint", str(untrained), "--prepared", str(prepared), "--out", str(mined)])

    hard = load_config(None, base + ["trainer.steps=2", "data.reddit_hard_negatives=true", "trainer.num_workers=1"])
    with pytest.raises(BadInputError, match="no 'negative' column, which data.reddit_hard_negatives=true"):
        run_training(hard, tmp_path / "refused", prepared_dir=prepared)
    result = run_training(hard, tmp_path / "hard", prepared_dir=mined)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(result.tracking_uri)
    losses = [m.value for m in client.get_metric_history(result.run_id, "reddit/loss")]
    assert losses and all(np.isfinite(losses))
    assert client.get_run(result.run_id).data.params["data.reddit_hard_negatives"] == "True"
    assert (result.checkpoint / "train_state.pt").is_file()


def test_mined_embeddings_are_cached_resumed_and_never_reused_for_another_model(ray_session, sample_prepared, tmp_path):
    """--embeddings: a run writes each chunk's embeddings, a run killed mid-way resumes from its
    whole chunks to the same negatives, a re-run with other ranges encodes nothing, and a folder
    made by another checkpoint or for other pairs is refused."""
    from convsts.models.checkpoint import save_checkpoint
    from convsts.models.sentence_encoder import load
    from convsts.ray_jobs.pipelines.hard_negatives import EncodePool, mine_prepared
    from convsts.ray_jobs.training.tokenizer_fit import build_tokenizer

    cfg = load_config(None, TINY_DAN)
    tokenizer = build_tokenizer(cfg, str(sample_prepared))
    checkpoints = []
    for seed in (0, 1):
        seed_everything(seed)
        checkpoints.append(tmp_path / f"untrained{seed}")
        save_checkpoint(checkpoints[-1], build_model(cfg.model, tokenizer, model_heads(cfg)), tokenizer, cfg.to_dict())
    cache = tmp_path / "emb"

    def run(out, checkpoint=checkpoints[0], pairs=0, pool=None, **ranges):
        mining = MiningConfig(**{"range_min": 1, "range_max": 20, **ranges})
        manifest = mine_prepared(
            str(checkpoint),
            str(sample_prepared),
            str(tmp_path / out),
            mining,
            pairs,
            64,
            embeddings=str(cache),
            chunk=200,
            pool=pool,
        )
        return manifest["negatives"], pd.read_parquet(tmp_path / out / "reddit" / "train")

    (tmp_path / "a_file").write_text("")
    with pytest.raises(BadInputError, match=r"a_file: a file, not a folder; give --embeddings a folder"):
        mine_prepared(
            str(checkpoints[0]),
            str(sample_prepared),
            str(tmp_path / "refused"),
            MiningConfig(),
            0,
            64,
            embeddings=str(tmp_path / "a_file"),
        )

    first, mined = run("first")
    chunks = sorted(p.name for p in cache.glob("*.npy"))
    n = first["sampled_pairs"]
    assert first["embedding_chunks_reused"] == 0 and len(chunks) == 2 * -(-n // 200)
    contexts = np.concatenate([np.load(cache / c) for c in chunks if c.startswith("context")])
    frame = pd.read_parquet(sample_prepared / "reddit" / "train")
    frame = frame.sort_values(list(frame.columns), kind="stable").reset_index(drop=True)
    np.testing.assert_allclose(contexts, load(checkpoints[0]).encode(frame["context"].tolist()), atol=1e-5)

    (cache / chunks[1]).unlink()  # a run killed while encoding that chunk: its file is not there
    (cache / (chunks[1] + ".partial")).write_bytes(b"half")
    resumed, again = run("resumed")
    assert resumed["embedding_chunks_reused"] == len(chunks) - 1
    pd.testing.assert_frame_equal(again, mined)  # the same negatives as the uninterrupted run
    # The same chunks encoded by a pool of Ray Data actors (--workers) instead of this process.
    for chunk_file in chunks[1:4]:
        (cache / chunk_file).unlink()
    pooled, again = run("pooled", pool=EncodePool(workers=2, cpus_per_worker=0.5))
    assert pooled["embedding_chunks_reused"] == len(chunks) - 3 and pooled["encode_workers"] == 2
    assert sorted(p.name for p in cache.glob("*.npy")) == chunks
    pd.testing.assert_frame_equal(again, mined)
    # The same checkpoint read from a bucket (as Ray Train keeps them on a cluster): the same weights,
    # so its embeddings are reused.
    from testkit.s3_server import s3_endpoint, upload

    with s3_endpoint("convsts-models"):
        uri = "s3://convsts-models/untrained0"
        for file in checkpoints[0].iterdir():
            upload(file, f"{uri}/{file.name}")
        wider, _ = run("wider", checkpoint=uri, range_min=5, range_max=50)
    assert wider["embedding_chunks_reused"] == len(chunks) and wider["mined_pairs"] > 0 and wider["checkpoint"] == uri

    with pytest.raises(BadInputError, match=r"emb/key.json: these embeddings are of another checkpoint_weights than"):
        run("other_model", checkpoint=checkpoints[1])
    with pytest.raises(BadInputError, match=r"emb/key.json: these embeddings are of another pairs and pairs_text than"):
        run("other_pairs", pairs=300)
