"""Sentence encoders: token-id dict -> (B, D) embeddings (MultitaskModel.encode L2-normalizes them). Pure torch.

Every encoder has one interface: built from the model config and the tokenizer's vocabulary sizes
(`from_config`), it names the tokenizer kind it needs (`tokenizer_kind`, a key of
`convsts.datasets.text.TOKENIZERS`), encodes the dict of id tensors that tokenizer produces
(`forward(inputs) -> (B, output_dim)`) and lists its parameters whose gradients are sparse
(`sparse_parameters()`, which the optimizer factory and the gradient exchange take explicitly).
`ENCODERS` maps `model.encoder` names to the classes; `build_encoder` is the one way to make one.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from convsts.datasets.pretrained import pretrained_folder
from convsts.models.config import (
    ENCODER_NAMES,
    POOLINGS,  # noqa: F401 - part of this module's API
    BiLstmConfig,
    DanConfig,
    ModelConfig,
    PretrainedConfig,
    TransformerConfig,
)

Inputs = dict[str, torch.Tensor]


class DanEncoder(nn.Module):
    """Deep averaging network: (word + bigram embeddings) summed, / sqrt(n), then a DNN."""

    name = "dan"  # its `model.encoder` value
    tokenizer_kind = "dan"  # word ids + hashed bigram ids

    @classmethod
    def from_config(cls, config: ModelConfig, num_words: int, num_bigrams: int) -> DanEncoder:
        return cls(config.dan, num_words, num_bigrams)

    def __init__(self, config: DanConfig, num_words: int, num_bigrams: int):
        super().__init__()
        self.config = config
        d = config.embedding_dim
        # No padding_idx: _bag_sum never looks up padding (id 0), and a padding_idx would make the
        # sparse backward mask every looked-up row. Row 0 stays zero because nothing reads it.
        self.word_embedding = nn.EmbeddingBag(num_words, d, mode="sum", sparse=config.sparse_embeddings)
        self.bigram_embedding = nn.EmbeddingBag(num_bigrams, d, mode="sum", sparse=config.sparse_embeddings)
        for table in (self.word_embedding, self.bigram_embedding):
            nn.init.normal_(table.weight, std=d**-0.5)
            with torch.no_grad():
                table.weight[0].zero_()
        sizes = [d, *config.hidden_sizes]
        layers: list[nn.Module] = []
        for n_in, n_out in zip(sizes, sizes[1:]):
            layers += [nn.Linear(n_in, n_out), nn.Tanh()]
        layers.append(nn.Linear(sizes[-1], config.output_dim))
        self.dnn = nn.Sequential(*layers)

    @property
    def output_dim(self) -> int:
        return self.config.output_dim

    def sparse_parameters(self) -> list[torch.Tensor]:
        if not self.config.sparse_embeddings:
            return []
        return [self.word_embedding.weight, self.bigram_embedding.weight]

    @staticmethod
    def _bag_sum(table: nn.EmbeddingBag, ids: torch.Tensor) -> torch.Tensor:
        """Sum of each row's non-padding embeddings. The padded (B, L) ids are flattened to the
        real tokens plus offsets first: padding would otherwise be looked up, masked and carried
        into the sparse gradient (most of a fixed-width batch is padding)."""
        mask = ids != 0  # (B, L)
        if torch.compiler.is_exporting():  # ONNX/torch.export: no data-dependent shapes; same sum
            return (table.weight[ids] * mask.unsqueeze(-1).to(table.weight.dtype)).sum(1)  # (B, d)
        flat = ids[mask]  # (N,) real tokens, row by row
        offsets = torch.zeros(ids.shape[0], dtype=torch.long, device=ids.device)  # (B,)
        offsets[1:] = mask.sum(1).cumsum(0)[:-1]
        return table(flat, offsets)  # (B, d); an empty row sums to zeros

    def forward(self, inputs: Inputs) -> torch.Tensor:
        words, bigrams = inputs["words"], inputs["bigrams"]  # (B, L), (B, L)
        n = (words != 0).sum(dim=1).clamp(min=1).to(torch.float32)  # (B,)
        summed = self._bag_sum(self.word_embedding, words) + self._bag_sum(self.bigram_embedding, bigrams)  # (B, d)
        averaged = summed / n.sqrt().unsqueeze(1)  # (B, d)
        return self.dnn(averaged)  # (B, output_dim)


def timing_signal(length: int, channels: int, device=None) -> torch.Tensor:
    """Sinusoidal position signal of Vaswani et al. (2017): (length, channels)."""
    position = torch.arange(length, dtype=torch.float32, device=device).unsqueeze(1)  # (L, 1)
    half = channels // 2
    inv_freq = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=device) / max(half - 1, 1))
    angles = position * inv_freq.unsqueeze(0)  # (L, C/2)
    signal = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)  # (L, 2*(C/2))
    if channels % 2:
        signal = F.pad(signal, (0, 1))
    return signal


class TransformerSentenceEncoder(nn.Module):
    """Transformer encoder with a sinusoidal timing signal and mean pooling over non-padding positions."""

    name = "transformer"
    tokenizer_kind = "subword"  # WordPiece ids

    @classmethod
    def from_config(cls, config: ModelConfig, num_words: int, num_bigrams: int) -> TransformerSentenceEncoder:
        return cls(config.transformer, num_words)

    def __init__(self, config: TransformerConfig, num_tokens: int):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.embedding = nn.Embedding(num_tokens, h, padding_idx=0)
        nn.init.normal_(self.embedding.weight, std=h**-0.5)
        layer = nn.TransformerEncoderLayer(
            h, config.num_heads, config.filter_size, config.dropout, batch_first=True, norm_first=True
        )
        # Nested tensors would make a sentence's output depend on the batch's padding layout.
        self.layers = nn.TransformerEncoder(layer, config.num_layers, enable_nested_tensor=False)
        self.final_norm = nn.LayerNorm(h)
        self.projection = nn.Linear(h, config.output_dim)
        self.register_buffer("timing", timing_signal(config.max_positions, h), persistent=False)

    @property
    def output_dim(self) -> int:
        return self.config.output_dim

    def sparse_parameters(self) -> list[torch.Tensor]:
        return []

    def forward(self, inputs: Inputs) -> torch.Tensor:
        ids = inputs["ids"] if "ids" in inputs else inputs["words"]  # (B, L): subword ids, or word ids
        # Batches arrive padded to a fixed width; attention and feed-forward cost grow with every
        # position, so cut the trailing columns no sentence uses (masked anyway: same result).
        if not torch.compiler.is_exporting():  # an exported graph takes the width it is given
            used = int((ids != 0).sum(1).max()) if ids.numel() else 0
            ids = ids[:, : max(1, min(used, self.config.max_positions))]
        mask = ids != 0  # (B, L)
        # A row of padding only (an empty text) would attend to no key: NaN in attention. It attends
        # to its first position instead; pooling still ignores it, so its embedding is finite.
        first = torch.zeros_like(mask)  # (B, L)
        first[:, 0] = True
        attend = mask | (first & ~mask.any(1, keepdim=True))  # (B, L)
        x = self.embedding(ids) * math.sqrt(self.config.hidden_size)  # (B, L, H)
        timing: torch.Tensor = self.timing  # type: ignore[assignment]  # a buffer: (max_positions, H)
        x = x + timing[: ids.shape[1]].unsqueeze(0)  # (B, L, H)
        x = self.final_norm(self.layers(x, src_key_padding_mask=~attend))  # (B, L, H)
        weights = mask.unsqueeze(-1).to(x.dtype)  # (B, L, 1)
        pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=1.0)  # (B, H)
        return self.projection(pooled)  # (B, output_dim)


class BiLstmMaxEncoder(nn.Module):
    """InferSent's encoder: BiLSTM over word embeddings, max pooling over time."""

    name = "bilstm"
    tokenizer_kind = "dan"  # word ids (its bigram ids are not used)

    @classmethod
    def from_config(cls, config: ModelConfig, num_words: int, num_bigrams: int) -> BiLstmMaxEncoder:
        return cls(config.bilstm, num_words)

    def __init__(self, config: BiLstmConfig, num_words: int):
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(num_words, config.embedding_dim, padding_idx=0)
        self.lstm = nn.LSTM(config.embedding_dim, config.hidden_size, batch_first=True, bidirectional=True)
        width = 2 * config.hidden_size
        self.projection = nn.Linear(width, config.output_dim) if config.output_dim else nn.Identity()

    @property
    def output_dim(self) -> int:
        return self.config.output_dim or 2 * self.config.hidden_size

    def sparse_parameters(self) -> list[torch.Tensor]:
        return []

    def forward(self, inputs: Inputs) -> torch.Tensor:
        words = inputs["words"]  # (B, L)
        mask = words != 0  # (B, L)
        lengths = mask.sum(1).clamp(min=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(
            self.embedding(words), lengths, batch_first=True, enforce_sorted=False
        )
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=words.shape[1])  # (B, L, 2H)
        out = out.masked_fill(~mask.unsqueeze(-1), float("-inf"))
        pooled = out.max(dim=1).values  # (B, 2H)
        pooled = torch.where(torch.isinf(pooled), torch.zeros_like(pooled), pooled)
        return self.projection(pooled)  # (B, output_dim)


def _without_pooler(hf_config) -> dict[str, Any]:
    """AutoModel's keyword that leaves out the pooler ([CLS] dense + tanh, unused by our pooling),
    for the architectures that have one (BERT, RoBERTa, MPNet; not DistilBERT)."""

    from transformers import (
        AutoModel,
    )

    model_class: Any = AutoModel._model_mapping[type(hf_config)]  # a model class (typed loosely by transformers)
    return {"add_pooling_layer": False} if "add_pooling_layer" in inspect.signature(model_class).parameters else {}


class PretrainedEncoder(nn.Module):
    """A BERT-family model (Hugging Face `transformers`) pooled over its non-padding tokens, with
    an optional linear projection. Built from the weights' folder the first time; from the
    architecture stored in the checkpoint (`hf_config`) when a checkpoint is loaded."""

    name = "pretrained"
    tokenizer_kind = "pretrained"  # the model's own tokenizer.json

    @classmethod
    def from_config(cls, config: ModelConfig, num_words: int, num_bigrams: int) -> PretrainedEncoder:
        return cls(config.pretrained)

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        from transformers import (
            AutoConfig,
            AutoModel,
        )

        if config.pooling not in POOLINGS:
            raise ValueError(f"model.pretrained.pooling: expected {'|'.join(POOLINGS)}, got {config.pooling!r}")
        self.config = config
        if config.hf_config:  # a checkpoint: its own weights follow (load_state_dict)
            hf_config = AutoConfig.for_model(**config.hf_config)
            self.model = AutoModel.from_config(hf_config, **_without_pooler(hf_config))
        else:
            folder = str(pretrained_folder(config.path))
            hf_config = AutoConfig.from_pretrained(folder)
            self.model = _quietly(AutoModel.from_pretrained, folder, config=hf_config, **_without_pooler(hf_config))
            config.hf_config = self.model.config.to_diff_dict()
        hidden = self.model.config.hidden_size
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self.projection = nn.Linear(hidden, config.output_dim) if config.output_dim else nn.Identity()
        self._freeze(config.train_layers)

    def _freeze(self, train_layers: int) -> None:
        """Everything but the top `train_layers` transformer blocks stops training: the embeddings
        and the lower blocks. The blocks are the model's ModuleList of `num_hidden_layers` modules,
        wherever its architecture keeps them (BERT, MiniLM, RoBERTa, MPNet: encoder.layer;
        DistilBERT: transformer.layer)."""
        if train_layers < 0:
            return
        count = self.model.config.num_hidden_layers
        lists = [m for m in self.model.modules() if isinstance(m, nn.ModuleList) and len(m) == count]
        if not lists:
            raise ValueError(
                f"model.pretrained.train_layers={train_layers}: no list of {count} layers in "
                f"{type(self.model).__name__}; use -1 (every layer trains)"
            )
        layers = list(lists[0])
        frozen = [
            self.model.get_input_embeddings(),
            getattr(self.model, "embeddings", nn.Identity()),
            *layers[: max(0, len(layers) - train_layers)],
        ]
        for module in frozen:
            for p in module.parameters():
                p.requires_grad_(False)

    @property
    def output_dim(self) -> int:
        return self.config.output_dim or self.model.config.hidden_size

    def sparse_parameters(self) -> list[torch.Tensor]:
        return []

    def forward(self, inputs: Inputs) -> torch.Tensor:
        ids = inputs["ids"]  # (B, L) the model's token ids, padded with its pad id
        mask = ids != self.pad_id  # (B, L)
        if not torch.compiler.is_exporting():  # trailing all-padding columns cost only time
            used = int(mask.sum(1).max()) if ids.numel() else 0
            ids, mask = ids[:, : max(1, used)], mask[:, : max(1, used)]
        x = self.model(input_ids=ids, attention_mask=mask.long()).last_hidden_state  # (B, L, H)
        weights = mask.unsqueeze(-1).to(x.dtype)  # (B, L, 1)
        if self.config.pooling == "cls":
            pooled = x[:, 0]  # (B, H)
        elif self.config.pooling == "max":
            pooled = x.masked_fill(~mask.unsqueeze(-1), torch.finfo(x.dtype).min).max(1).values  # (B, H)
            pooled = pooled * mask.any(1, keepdim=True)  # an all-padding row pools to zeros
        else:
            pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=1.0)  # (B, H)
        return self.projection(pooled)  # (B, output_dim)


def _quietly(load, *args, **kwargs):
    """`transformers` loading without its progress bar and load report (the weights of the
    pooling layer that mean pooling leaves out are reported as unexpected)."""
    from transformers.utils import (
        logging as hf_logging,
    )

    level, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        return load(*args, **kwargs)
    finally:
        hf_logging.set_verbosity(level)
        if bar:
            hf_logging.enable_progress_bar()


# `model.encoder` name -> encoder class. A new family is one class with the interface above (its
# `name` the config value), an entry here, and its architecture dataclass as a field of convsts.models.config.ModelConfig.
ENCODERS: dict[str, type] = {
    cls.name: cls for cls in (DanEncoder, TransformerSentenceEncoder, BiLstmMaxEncoder, PretrainedEncoder)
}
assert tuple(ENCODERS) == ENCODER_NAMES, "models/config.py's ENCODER_NAMES lists the ENCODERS registry"


def encoder_class(name: str) -> type[Any]:
    if name not in ENCODERS:
        raise ValueError(f"model.encoder: expected one of {'|'.join(ENCODERS)}, got {name!r}")
    return ENCODERS[name]


def build_encoder(config: ModelConfig, num_words: int, num_bigrams: int) -> Any:
    return encoder_class(config.encoder).from_config(config, num_words, num_bigrams)
