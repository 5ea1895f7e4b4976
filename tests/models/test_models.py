import math

import numpy as np
import pytest
import torch

from convsts.datasets.config import TokenizerConfig
from convsts.datasets.text import DanTokenizer, count_words
from convsts.io.errors import BadInputError
from convsts.models.checkpoint import build_model, save_checkpoint
from convsts.models.config import BiLstmConfig, DanConfig, ModelConfig, TransformerConfig
from convsts.models.encoders import timing_signal
from convsts.models.losses import in_batch_softmax_loss, nli_loss
from convsts.models.sentence_encoder import load

TEXTS = ["the cat sat on the mat", "a dog", "cats and dogs living together", "the end"]


def tiny_config(encoder: str) -> ModelConfig:
    return ModelConfig(
        encoder=encoder,
        dan=DanConfig(embedding_dim=16, hidden_sizes=[12], output_dim=10),
        transformer=TransformerConfig(
            num_layers=2, num_heads=2, hidden_size=16, filter_size=32, dropout=0.0, output_dim=10
        ),
        bilstm=BiLstmConfig(hidden_size=8, embedding_dim=12, output_dim=10),
        response_hidden=14,
        nli_hidden=9,
    )


@pytest.fixture
def tokenizer():
    return DanTokenizer.build(count_words(TEXTS), TokenizerConfig(bigram_buckets=64))


def _encode(model, tokenizer, texts, width=None):
    with torch.no_grad():
        return model.encode({k: torch.from_numpy(v) for k, v in tokenizer.encode(texts, width=width).items()})


@pytest.mark.parametrize("encoder", ["dan", "transformer", "bilstm"])
def test_shapes_and_unit_norm(encoder, tokenizer):
    torch.manual_seed(0)
    model = build_model(tiny_config(encoder), tokenizer).eval()
    emb = _encode(model, tokenizer, TEXTS)
    assert emb.shape == (4, 10)
    assert torch.allclose(emb.norm(dim=1), torch.ones(4), atol=1e-5)
    ctx = {k: torch.from_numpy(v) for k, v in tokenizer.encode(TEXTS[:2]).items()}
    c, r = model.encode_both(ctx, ctx)
    assert c.shape == model.heads["reddit"](r).shape == (2, 10)
    assert model.heads["snli"](c, r).shape == (2, 3)


@pytest.mark.parametrize("encoder", ["dan", "transformer", "bilstm"])
def test_padding_and_batch_composition_do_not_change_an_embedding(encoder, tokenizer):
    torch.manual_seed(0)
    model = build_model(tiny_config(encoder), tokenizer).eval()
    alone = _encode(model, tokenizer, ["a dog"])
    padded = _encode(model, tokenizer, ["a dog"], width=12)
    in_batch = _encode(model, tokenizer, ["cats and dogs living together", "a dog", "the end"])[1:2]
    assert torch.allclose(alone, padded, atol=1e-5)
    assert torch.allclose(alone, in_batch, atol=1e-5)


def test_dan_is_sum_over_sqrt_n(tokenizer):
    torch.manual_seed(0)
    model = build_model(tiny_config("dan"), tokenizer).eval()
    enc = model.encoder
    ids = tokenizer.encode(["the cat sat"])
    w, b = torch.from_numpy(ids["words"]), torch.from_numpy(ids["bigrams"])
    by_hand = (enc.word_embedding.weight[w[0]].sum(0) + enc.bigram_embedding.weight[b[0][b[0] > 0]].sum(0)) / math.sqrt(
        3
    )
    expected = enc.dnn(by_hand.unsqueeze(0))
    assert torch.allclose(enc({"words": w, "bigrams": b}), expected, atol=1e-6)
    unit = torch.nn.functional.normalize(expected, dim=-1)  # what model.encode gives
    assert torch.allclose(model.encode({"words": w, "bigrams": b}), unit, atol=1e-6)


def test_dan_embedding_gradients_are_sparse(tokenizer):
    model = build_model(tiny_config("dan"), tokenizer)
    ids = {k: torch.from_numpy(v) for k, v in tokenizer.encode(TEXTS).items()}
    model.encode(ids).sum().backward()
    assert model.encoder.word_embedding.weight.grad.is_sparse


def test_dan_sparse_gradient_touches_only_the_real_tokens(tokenizer):
    model = build_model(tiny_config("dan"), tokenizer)
    ids = {k: torch.from_numpy(v) for k, v in tokenizer.encode(["a dog", ""], width=10).items()}
    model.encode(ids).sum().backward()
    rows = model.encoder.word_embedding.weight.grad.coalesce().indices()[0]
    assert set(rows.tolist()) == set(ids["words"][0][ids["words"][0] > 0].tolist())  # no padding row 0


@pytest.mark.parametrize("encoder", ["dan", "transformer", "bilstm"])
@pytest.mark.parametrize("train", [False, True])
def test_an_empty_text_gets_a_finite_embedding_and_changes_no_other(encoder, train, tokenizer):
    """A row of padding only: in eval mode PyTorch's fused attention gave the Transformer NaN there."""
    torch.manual_seed(0)
    model = build_model(tiny_config(encoder), tokenizer).train(train)
    torch.manual_seed(1)
    emb = _encode(model, tokenizer, ["", "a dog", ""], width=6)
    assert torch.isfinite(emb).all()
    if not train:  # (dropout makes train-mode embeddings differ between calls)
        assert torch.allclose(emb[1], _encode(model, tokenizer, ["a dog"])[0], atol=1e-5)


@pytest.mark.parametrize("encoder", ["dan", "transformer", "bilstm"])
def test_both_sides_in_one_encoder_call_equal_two_calls(encoder, tokenizer):
    """Task losses encode both sides in one call: same values, same gradients."""
    torch.manual_seed(0)
    model = build_model(tiny_config(encoder), tokenizer).eval()
    left = {k: torch.from_numpy(v) for k, v in tokenizer.encode(TEXTS[:3], width=8).items()}
    right = {k: torch.from_numpy(v) for k, v in tokenizer.encode(TEXTS[1:], width=8).items()}

    def grads():
        return {
            n: (p.grad.to_dense() if p.grad.is_sparse else p.grad).clone()
            for n, p in model.named_parameters()
            if p.grad is not None
        }

    u, v = model.encode_both(left, right)
    (u * v).sum().backward()
    joint = grads()
    model.zero_grad(set_to_none=True)
    u2, v2 = model.encode(left), model.encode(right)
    (u2 * v2).sum().backward()
    separate = grads()
    assert torch.allclose(u, u2, atol=1e-6) and torch.allclose(v, v2, atol=1e-6)
    assert joint.keys() == separate.keys()
    for name in joint:
        assert torch.allclose(joint[name], separate[name], atol=1e-6), name


def test_timing_signal_is_sinusoidal():
    sig = timing_signal(5, 4)
    assert sig.shape == (5, 4)
    assert torch.allclose(sig[:, 0], torch.sin(torch.arange(5.0)))
    assert torch.allclose(sig[0], torch.tensor([0.0, 0.0, 1.0, 1.0]))


def test_in_batch_softmax_loss_by_hand():
    context = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    response = torch.tensor([[2.0, 0.0], [1.0, 1.0]])
    # scores = [[2, 1], [0, 1]]; loss = mean(-log softmax(row)[i])
    row0 = -math.log(math.exp(2) / (math.exp(2) + math.exp(1)))
    row1 = -math.log(math.exp(1) / (math.exp(0) + math.exp(1)))
    assert in_batch_softmax_loss(context, response).item() == pytest.approx((row0 + row1) / 2, rel=1e-6)
    # symmetric: also each response picks its context from the columns [2, 0] and [1, 1]
    col0 = -math.log(math.exp(2) / (math.exp(2) + math.exp(0)))
    col1 = -math.log(math.exp(1) / (math.exp(1) + math.exp(1)))
    expected = ((row0 + row1) / 2 + (col0 + col1) / 2) / 2
    assert in_batch_softmax_loss(context, response, symmetric=True).item() == pytest.approx(expected, rel=1e-6)
    # negatives: extra candidates for every context
    negatives = torch.tensor([[3.0, 0.0], [0.0, -1.0]])  # scores: context 0 -> [3, 0], context 1 -> [0, -1]
    row0 = -math.log(math.exp(2) / (math.exp(2) + math.exp(1) + math.exp(3) + math.exp(0)))
    row1 = -math.log(math.exp(1) / (math.exp(0) + math.exp(1) + math.exp(0) + math.exp(-1)))
    assert in_batch_softmax_loss(context, response, negatives=negatives).item() == pytest.approx(
        (row0 + row1) / 2, rel=1e-6
    )
    # ... and the symmetric half stays over the contexts only (the columns of the true responses)
    expected = ((row0 + row1) / 2 + (col0 + col1) / 2) / 2
    assert in_batch_softmax_loss(context, response, symmetric=True, negatives=negatives).item() == pytest.approx(
        expected, rel=1e-6
    )


def test_nli_loss_by_hand():
    logits = torch.tensor([[0.0, 0.0, 0.0], [3.0, 0.0, 0.0]])
    labels = torch.tensor([1, 0])
    expected = (math.log(3) + -math.log(math.exp(3) / (math.exp(3) + 2))) / 2
    assert nli_loss(logits, labels).item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("encoder", ["dan", "transformer"])
def test_checkpoint_round_trip_gives_identical_embeddings(encoder, tokenizer, tmp_path):
    torch.manual_seed(0)
    model = build_model(tiny_config(encoder), tokenizer).eval()
    before = _encode(model, tokenizer, TEXTS).numpy()
    save_checkpoint(tmp_path / "ckpt", model, tokenizer, {"note": "test"})
    loaded = load(tmp_path / "ckpt")
    assert np.array_equal(before, loaded.encode(TEXTS, batch_size=len(TEXTS)))
    # Other batch sizes pad differently: equal up to float rounding.
    assert np.allclose(before, loaded.encode(TEXTS, batch_size=3), atol=1e-6)
    assert loaded.meta["run_config"] == {"note": "test"}
    assert loaded.classify_nli(TEXTS[:2], TEXTS[2:]).shape == (2, 3)


def test_load_rejects_a_folder_that_is_not_a_checkpoint(tmp_path):
    with pytest.raises(BadInputError, match="not a complete checkpoint or model folder \\(no manifest.json"):
        load(tmp_path)  # a folder without a manifest is refused: nothing tells it from one cut short


def test_untrained_response_head_is_the_identity(tokenizer):
    """The response-side network is a residual branch that starts at zero, so a fresh model scores
    responses by the encoder's own dot product."""
    model = build_model(tiny_config("dan"), tokenizer).eval()
    emb = torch.nn.functional.normalize(torch.randn(5, 10), dim=-1)
    assert torch.equal(model.heads["reddit"](emb), emb)
    model.heads["reddit"].net[-1].weight.data.fill_(0.1)  # once trained it does change the response side
    assert not torch.allclose(model.heads["reddit"](emb), emb)
