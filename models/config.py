"""One dataclass per architecture; the chosen one is stored in every checkpoint (config.json)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass
class DanConfig:
    embedding_dim: int = 300
    hidden_sizes: List[int] = field(default_factory=lambda: [300, 300])
    output_dim: int = 500
    sparse_embeddings: bool = True  # sparse gradients: an SGD step touches only the rows in the batch


@dataclass
class TransformerConfig:
    num_layers: int = 6
    num_heads: int = 8
    hidden_size: int = 512
    filter_size: int = 2048
    dropout: float = 0.1
    max_positions: int = 512
    output_dim: int = 500


@dataclass
class BiLstmConfig:
    """InferSent (Conneau et al., 2017): BiLSTM with max pooling; paper size 2048 per direction."""

    hidden_size: int = 2048
    embedding_dim: int = 300
    output_dim: int = 0  # 0 = no projection: the embedding is 2 * hidden_size wide


@dataclass
class ModelConfig:
    encoder: str = "dan"  # dan | transformer | bilstm
    dan: DanConfig = field(default_factory=DanConfig)
    transformer: TransformerConfig = field(default_factory=TransformerConfig)
    bilstm: BiLstmConfig = field(default_factory=BiLstmConfig)
    response_hidden: int = 500  # the feed-forward network on the response side only
    nli_hidden: int = 512
    nli_classes: int = 3
