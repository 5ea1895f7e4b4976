"""`SentenceEncoder.encode` with the options SentenceTransformer.encode users know, on a real
checkpoint (tiny DAN and Transformer): shapes for one string and for lists, tensors, devices,
normalization, the progress bar, input order; the same on encode_responses and classify_nli;
`similarity` and `similarity_pairwise` as sentence-transformers computes them, and the
evaluation's STS score."""

import numpy as np
import pytest
import torch

from convsts.datasets.config import TokenizerConfig
from convsts.datasets.text import DanTokenizer, SubwordTokenizer, count_words
from convsts.models.checkpoint import build_model, save_checkpoint
from convsts.models.config import DanConfig, ModelConfig, TransformerConfig
from convsts.models.sentence_encoder import load

TEXTS = ["the cat sat on the mat", "a dog", "cats and dogs living together in one small house", "", "the end"]
HEADS = {"reddit": "response", "snli": "nli"}


@pytest.fixture(params=["dan", "transformer"])
def encoder(request, tmp_path):
    torch.manual_seed(0)
    if request.param == "dan":
        tokenizer = DanTokenizer.build(count_words(TEXTS), TokenizerConfig(bigram_buckets=64))
        config = ModelConfig(
            encoder="dan",
            dan=DanConfig(embedding_dim=16, hidden_sizes=[16], output_dim=12),
            response_hidden=8,
            nli_hidden=8,
        )
    else:
        tokenizer = SubwordTokenizer.train(TEXTS * 5, TokenizerConfig(subword_vocab_size=200, min_count=1))
        config = ModelConfig(
            encoder="transformer",
            response_hidden=8,
            nli_hidden=8,
            transformer=TransformerConfig(
                num_layers=1, num_heads=2, hidden_size=16, filter_size=32, output_dim=12, dropout=0.0
            ),
        )
    save_checkpoint(tmp_path / "ckpt", build_model(config, tokenizer, HEADS), tokenizer, {})
    return load(tmp_path / "ckpt")


def test_one_string_gives_one_vector_and_a_list_gives_rows(encoder):
    one = encoder.encode("a man is playing a guitar")
    assert one.shape == (12,) and one.dtype == np.float32  # not 25 rows, one per character
    many = encoder.encode(["a man is playing a guitar"] + TEXTS)
    assert many.shape == (6, 12)
    np.testing.assert_allclose(many[0], one, atol=1e-6)
    assert encoder.encode([]).shape == (0, 12)


def test_rows_come_back_in_input_order_whatever_the_batching(encoder):
    alone = np.stack([encoder.encode(t) for t in TEXTS])
    for batch_size in (1, 2, 64):
        np.testing.assert_allclose(encoder.encode(TEXTS, batch_size=batch_size), alone, atol=1e-5)
    assert np.isfinite(alone).all()  # the empty text included


def test_tensors_devices_and_normalization(encoder):
    as_tensor = encoder.encode(TEXTS, convert_to_tensor=True, device="cpu")
    assert isinstance(as_tensor, torch.Tensor) and as_tensor.device.type == "cpu" and as_tensor.shape == (5, 12)
    auto = encoder.encode(TEXTS, device="auto", convert_to_tensor=True).cpu()  # CUDA when there is one
    torch.testing.assert_close(auto, as_tensor, atol=1e-4, rtol=0)
    encoder.to("cpu")
    unit = encoder.encode(TEXTS[:3])
    raw = encoder.encode(TEXTS[:3], normalize_embeddings=False)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-3)  # the encoder's own output
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), unit, atol=1e-5)
    with pytest.raises(ValueError, match="normalize_embeddings"):
        encoder.encode(TEXTS, tuned=True, normalize_embeddings=False)


def test_progress_bar_on_request_and_off_by_default_without_a_terminal(encoder, capsys):
    encoder.encode(TEXTS * 10, batch_size=2, show_progress_bar=True)
    assert "25/25" in capsys.readouterr().err
    encoder.encode(TEXTS * 10, batch_size=2)  # 25 batches, but pytest's stderr is not a terminal
    assert capsys.readouterr().err == ""


def test_responses_and_nli_take_the_same_options(encoder):
    assert encoder.encode_responses("a dog").shape == (12,)
    responses = encoder.encode_responses(TEXTS, batch_size=2, convert_to_tensor=True)
    assert isinstance(responses, torch.Tensor) and responses.shape == (5, 12)
    torch.testing.assert_close(responses[1], torch.from_numpy(encoder.encode_responses("a dog")), atol=1e-5, rtol=0)
    unit = encoder.encode_responses(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(unit, encoder.encode(TEXTS, side="response"))  # encode's response side
    with pytest.raises(ValueError, match="side='left': use one of context, response"):
        encoder.encode(TEXTS, side="left")
    with pytest.raises(ValueError, match="context-side embeddings"):
        encoder.encode_responses(TEXTS, normalize_embeddings=True, tuned=True)
    assert encoder.classify_nli("a dog", "an animal").shape == (3,)
    logits = encoder.classify_nli(TEXTS, TEXTS[::-1], batch_size=2)
    assert logits.shape == (5, 3)
    np.testing.assert_allclose(logits[1], encoder.classify_nli(TEXTS[1], TEXTS[::-1][1]), atol=1e-5)
    with pytest.raises(ValueError, match="5 premises but 4 hypotheses"):
        encoder.classify_nli(TEXTS, TEXTS[:4])


@pytest.mark.gpu
def test_encode_on_cuda_equals_the_cpu(encoder):
    cpu = encoder.encode(TEXTS, device="cpu")
    cuda = encoder.encode(TEXTS, device="cuda", convert_to_tensor=True)
    assert cuda.device.type == "cuda"
    np.testing.assert_allclose(cuda.cpu().numpy(), cpu, atol=1e-4)
    assert encoder.classify_nli(TEXTS, TEXTS, device="cuda").shape == (5, 3)


def test_similarity_of_every_pair_and_of_row_pairs(encoder):
    from sentence_transformers import util

    from convsts.models.similarity import angular_score_np

    a, b = encoder.encode(TEXTS[:3]), encoder.encode(TEXTS[2:])
    sim = encoder.similarity(a, b)
    assert isinstance(sim, torch.Tensor) and sim.shape == (3, 3) and sim.dtype == torch.float32
    torch.testing.assert_close(sim, util.cos_sim(a, b), atol=1e-6, rtol=0)  # sentence-transformers' own
    assert sim[2, 0] == pytest.approx(1.0, abs=1e-6)  # TEXTS[2] against itself
    pairs = encoder.similarity_pairwise(a, b)
    torch.testing.assert_close(
        pairs, util.pairwise_cos_sim(torch.from_numpy(a), torch.from_numpy(b)), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(pairs, torch.diagonal(sim), atol=1e-6, rtol=0)
    # The paper's STS score on the 0-5 scale: the one `convsts evaluate` correlates with gold scores.
    sts = encoder.similarity(a, b, score="sts")
    expected = angular_score_np(np.repeat(a, 3, axis=0), np.tile(b, (3, 1))).reshape(3, 3)
    np.testing.assert_allclose(sts.numpy(), expected, atol=1e-5)
    assert sts[2, 0] == pytest.approx(5.0, abs=1e-2) and float(sts.min()) >= 0.0
    np.testing.assert_allclose(encoder.similarity_pairwise(a, b, score="sts").numpy(), np.diagonal(expected), atol=1e-5)
    # One embedding is one row; tensors, arrays and lists of tensors mix.
    one = encoder.encode("a dog", convert_to_tensor=True)
    assert encoder.similarity(one, b).shape == (1, 3)
    torch.testing.assert_close(encoder.similarity(list(torch.from_numpy(a)), b), sim, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="use one of cosine, sts"):
        encoder.similarity(a, b, score="dot")
    with pytest.raises(ValueError, match="as many rows"):
        encoder.similarity_pairwise(a, b[:2])


def test_an_item_that_is_not_a_string_is_one_type_error_naming_it(encoder):
    with pytest.raises(TypeError, match="encode: item 1 is NoneType None, not a string"):
        encoder.encode(["a dog", None])
    with pytest.raises(TypeError, match="encode: item 0 is float nan, not a string"):
        encoder.encode([float("nan")])
    assert encoder.encode([""]).shape == (1, encoder.dim)  # an empty string is text
