"""The data settings of a run config, one dataclass each (as models/config.py holds the models'):
pure, so that reading a run config imports no data pipeline."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RedditFilterConfig:
    """The paper's comment filters, applied to both sides of a pair (see docs/data.md)."""

    max_chars: int = 350  # a comment of this many characters or more is removed
    min_alpha_share: float = 0.7  # removed when alphabetic characters / all characters <= this
    # Removed when the raw body starts with one of these.
    banned_prefixes: list[str] = field(default_factory=lambda: ["https", "/r/", "@"])
    banned_bodies: list[str] = field(default_factory=lambda: ["[deleted]", "[removed]"])  # removed: deleted comments
    author_substring: str = "bot"  # removed when the author name contains this (case-insensitive)


@dataclass
class TokenizerConfig:
    lowercase: bool = True  # texts are lowercased before the word split
    word_vocab_size: int = 50_000  # most frequent training words; the rest map to <unk>
    min_count: int = 1  # a word seen fewer times stays out of the vocabulary
    bigram_buckets: int = 100_000  # bigrams are hashed into this many ids
    max_words: int = 64  # longer texts are truncated after normalization
    subword_vocab_size: int = 16_000  # Transformer only
