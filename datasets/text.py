"""Text normalization and tokenizers. A tokenizer is saved with each checkpoint (JSON), so that a
checkpoint alone can encode new text.

DAN: word ids from a frequency vocabulary built on the training data, and bigram ids hashed into
a fixed number of buckets (crc32 and a fixed mix, stable across machines, unlike Python's `hash`).
Transformer: a WordPiece vocabulary trained with Hugging Face `tokenizers`.
Pretrained: the pretrained model's own tokenizer.json, loaded with Hugging Face `tokenizers`.
"""

from __future__ import annotations

import html
import html.entities
import json
import re
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from convsts.datasets.config import TokenizerConfig
from convsts.datasets.pretrained import pretrained_folder
from convsts.io import storage

PAD_ID = 0
UNK_ID = 1
_TOKEN_RE = re.compile(r"\w+(?:'\w+)?|[^\w\s]", re.UNICODE)
_URL_RE = re.compile(r"https?://\S+|www\.\S+")


def normalize(text: str, lowercase: bool = True) -> str:
    """Unescape character references (Reddit keeps `&gt;`, `&amp;`: unescape), replace URLs by a
    marker, squeeze spaces."""
    text = text or ""
    if "&" in text:  # the slowest step; most texts have no reference
        text = unescape(text)
    text = _URL_RE.sub(" <url> ", text)
    if lowercase:
        text = text.lower()
    return " ".join(text.split())


# Character references where html.unescape finds them: numeric, or a name of up to 32 characters.
_CHARREF = re.compile(r"&(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)")
# The numeric references that are unescaped, each written with ";" (those Reddit text holds most:
# quotes, the ampersand, angle brackets, dashes, the ellipsis, no-break and zero-width spaces);
# other numeric references stay as written. A normalizer of the `tokenizers` library (hf_normalizer)
# replaces fixed strings, so it can hold these but not every number.
NUMERIC_REFERENCES = (34, 38, 39, 60, 62, 160, 8211, 8212, 8216, 8217, 8220, 8221, 8230, 0x200B)
_NUMERIC = {form: chr(code) for code in NUMERIC_REFERENCES for form in (f"&#{code};", f"&#x{code:x};", f"&#x{code:X};")}


def unescape(text: str) -> str:
    """html.unescape for every named reference HTML5 defines (with its `;`, and the legacy names a
    browser also reads without it: `&ampfoo` is `&foo`), and for NUMERIC_REFERENCES; one pass from
    left to right (`&amp;gt;` is `&gt;`). hf_normalizer does exactly this."""
    return _CHARREF.sub(_reference, text)


def _reference(found: re.Match) -> str:
    ref = found.group(1)
    if ref[0] == "#":
        return _NUMERIC.get(found.group(0), found.group(0))
    if ref in html.entities.html5:
        return html.entities.html5[ref]
    for end in range(len(ref) - 1, 1, -1):  # the longest legacy name before the rest (html.unescape's rule)
        if ref[:end] in html.entities.html5:
            return html.entities.html5[ref[:end]] + ref[end:]
    return found.group(0)


# Three Unicode noncharacters that hf_normalizer writes while it works: the ampersand that a
# reference stands for is held as HELD_AMP until every other reference is replaced (so that it
# starts none), and a literal HOLD in the text as HOLD + KEPT.
HOLD, HELD_AMP_MARK, KEPT = "\ufdd0", "\ufdd1", "\ufdd2"


def hf_normalizer(lowercase: bool = False):
    """`normalize` as a `tokenizers` normalizer, for exports whose tokenizer runs without this package
    (the sentence-transformers folder): it gives what `normalize` gives on any text. Each step
    replaces one fixed string (a pass over the text), in an order that makes the passes one
    left-to-right scan: the named references with `;` and the numeric ones, then the legacy names
    without `;`, longest first (a `;` form is whole, a prefix is not), then `&semi;`; the references
    to `&` are held until the end, so that none of them starts another reference."""
    html5 = html.entities.html5
    amp = [f"&{name}" for name, value in html5.items() if value == "&"]
    amp += [form for form, value in _NUMERIC.items() if value == "&"]
    plain = {f"&{name}": value for name, value in html5.items() if name.endswith(";") and value not in ("&", ";")}
    plain |= {form: value for form, value in _NUMERIC.items() if value != "&"}
    legacy = sorted((name for name in html5 if not name.endswith(";") and html5[name] != "&"), key=len, reverse=True)
    held = HOLD + HELD_AMP_MARK
    steps: list[normalizers.Normalizer] = [normalizers.Replace(HOLD, HOLD + KEPT)]
    steps += [normalizers.Replace(Regex("|".join(re.escape(a) for a in sorted(amp, key=len, reverse=True))), held)]
    steps += [normalizers.Replace(ref, value) for ref, value in plain.items()]
    steps += [normalizers.Replace(f"&{name}", html5[name]) for name in legacy]
    steps += [normalizers.Replace("&semi;", ";")]
    steps += [normalizers.Replace(held, "&"), normalizers.Replace(HOLD + KEPT, HOLD)]
    steps += [normalizers.Replace(Regex(_URL_RE.pattern), " <url> ")]
    steps += [normalizers.Lowercase()] if lowercase else []
    steps += [normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()]
    return normalizers.Sequence(steps)


def words(text: str, lowercase: bool = True) -> list[str]:
    return _TOKEN_RE.findall(normalize(text, lowercase))


def count_words(texts: Iterable[str], lowercase: bool = True) -> Counter:
    counts: Counter = Counter()
    for text in texts:
        counts.update(words(text, lowercase))
    return counts


OOV_CODES = 1 << 24  # an out-of-vocabulary word's code: num_words + crc32(word) mod this


def _mix64(x: np.ndarray) -> np.ndarray:
    """A stable 64-bit finalizer (MurmurHash3's fmix64) applied elementwise to uint64 codes."""
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xFF51AFD7ED558CCD)
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> np.uint64(33))


class DanTokenizer:
    """text -> (word ids, hashed bigram ids), each padded with 0 to the longest text in the batch.

    Bigram ids: each token gets a code, its word id when in the vocabulary, else num_words +
    crc32(word) mod 2^24 (so unknown words still make distinct bigrams); the ids of a whole batch
    are then hashed at once in numpy from neighbouring codes. The JSON names this scheme
    (BIGRAM_HASH); a tokenizer of any other is refused."""

    kind = "dan"
    fits_from_counts = True  # the vocabulary comes from word counts (counted in parallel by Ray Data)
    pad_id = PAD_ID
    BIGRAM_HASH = "codes"

    def __init__(self, vocab: Sequence[str], config: TokenizerConfig):
        self.config = config
        self.vocab = list(vocab)  # index i + 2 is the id of vocab[i]; 0 = pad, 1 = <unk>
        self._ids = {w: i + 2 for i, w in enumerate(self.vocab)}

    @classmethod
    def build(cls, counts: Counter, config: TokenizerConfig) -> DanTokenizer:
        # Ties broken by the word itself so that the vocabulary is the same on every machine.
        ranked = sorted((w for w, c in counts.items() if c >= config.min_count), key=lambda w: (-counts[w], w))
        return cls(ranked[: config.word_vocab_size], config)

    @property
    def num_words(self) -> int:
        return len(self.vocab) + 2

    def tokens(self, text: str) -> list[str]:
        return words(text, self.config.lowercase)[: self.config.max_words]

    def encode(self, texts: Sequence[str], width: int | None = None) -> dict[str, np.ndarray]:
        """Returns {"words": (B, L) int64, "bigrams": (B, L) int64}; L = `width` or the longest text."""
        token_lists = [self.tokens(t) for t in texts]
        longest = max([len(t) for t in token_lists] + [1])
        width = width or longest
        num_words, get = self.num_words, self._ids.get
        codes = np.zeros((len(texts), width), dtype=np.uint64)  # (B, L); 0 = padding
        for row, toks in enumerate(token_lists):
            toks = toks[:width]
            codes[row, : len(toks)] = [get(w) or num_words + zlib.crc32(w.encode("utf-8")) % OOV_CODES for w in toks]
        word_ids = np.where(codes >= num_words, UNK_ID, codes).astype(np.int64)  # (B, L)
        left, right = codes[:, :-1], codes[:, 1:]  # (B, L-1) each: neighbouring tokens
        hashed = _mix64((left << np.uint64(32)) | right) % np.uint64(self.config.bigram_buckets - 1) + np.uint64(1)
        bigram_ids = np.zeros((len(texts), width), dtype=np.int64)  # (B, L); at most L-1 used
        bigram_ids[:, :-1] = np.where(right > 0, hashed, 0)
        return {"words": word_ids, "bigrams": bigram_ids}

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "config": asdict(self.config), "vocab": self.vocab, "bigram_hash": self.BIGRAM_HASH}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DanTokenizer:
        if data.get("bigram_hash") != cls.BIGRAM_HASH:
            raise ValueError(f"bigram_hash: expected {cls.BIGRAM_HASH}, got {data.get('bigram_hash')!r}")
        return cls(data["vocab"], TokenizerConfig(**data["config"]))


def padded_ids(id_lists: Sequence[Sequence[int]], width: int | None, pad_id: int) -> np.ndarray:
    """(B, L) int64 ids, each row cut or padded with `pad_id` to `width` (default: the longest)."""
    width = width or max([len(i) for i in id_lists] + [1])
    ids = np.full((len(id_lists), width), pad_id, dtype=np.int64)  # (B, L)
    for row, seq in enumerate(id_lists):
        seq = seq[:width]
        ids[row, : len(seq)] = seq
    return ids


class _HuggingFaceTokenizer:
    """A Hugging Face `tokenizers` tokenizer saved as its JSON: ids, at most `max_words` of them (its
    truncation, so a pretrained model's [SEP] stays last), padded with its pad id."""

    kind = ""
    fits_from_counts = False

    def __init__(self, hf_json: str, config: TokenizerConfig):
        self.config = config
        self._hf_json = hf_json
        self._tok = Tokenizer.from_str(hf_json)
        padding = self._tok.padding or {}  # a model's own padding settings, read before turning them off
        self.pad_id = int(padding.get("pad_id", self._tok.token_to_id("[PAD]") or PAD_ID))
        self._tok.no_padding()
        self._tok.enable_truncation(max_length=config.max_words)

    @property
    def num_words(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, texts: Sequence[str], width: int | None = None) -> dict[str, np.ndarray]:
        encodings = self._tok.encode_batch([normalize(t, lowercase=False) for t in texts])
        return {"ids": padded_ids([e.ids for e in encodings], width, self.pad_id)}

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "config": asdict(self.config), "hf_tokenizer": self._hf_json}

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        return cls(data["hf_tokenizer"], TokenizerConfig(**data["config"]))


class SubwordTokenizer(_HuggingFaceTokenizer):
    """WordPiece ids for the Transformer, trained with Hugging Face `tokenizers` on training text."""

    kind = "subword"

    @classmethod
    def train(cls, texts: Iterable[str], config: TokenizerConfig) -> SubwordTokenizer:
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=config.lowercase)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(
            vocab_size=config.subword_vocab_size, special_tokens=["[PAD]", "[UNK]"], min_frequency=config.min_count
        )
        tok.train_from_iterator((normalize(t, lowercase=False) for t in texts), trainer=trainer)
        return cls(tok.to_str(), config)


class PretrainedTokenizer(_HuggingFaceTokenizer):
    """A pretrained model's own tokenizer (its tokenizer.json): ids with the model's special tokens
    ([CLS] ... [SEP])."""

    kind = "pretrained"

    @classmethod
    def from_model(cls, model_config, config: TokenizerConfig) -> PretrainedTokenizer:
        """The tokenizer of the weights that `model.pretrained.path` names."""
        folder = pretrained_folder(model_config.pretrained.path)
        if (folder / "tokenizer.json").is_file():
            return cls((folder / "tokenizer.json").read_text(encoding="utf-8"), config)
        # A release with only a WordPiece vocab.txt (plain BERT, MiniLM): `transformers` builds the
        # fast tokenizer it describes (lower-casing as its tokenizer_config.json says).
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(folder), use_fast=True).backend_tokenizer.to_str(), config)


# Tokenizer kind (an encoder's `tokenizer_kind`) -> class.
TOKENIZERS = {cls.kind: cls for cls in (DanTokenizer, SubwordTokenizer, PretrainedTokenizer)}


def fit_tokenizer(kind: str, texts: Iterable[str], config: TokenizerConfig, model_config=None):
    """A tokenizer of `kind` (an encoder's `tokenizer_kind`) fitted on `texts`: the DAN's counted words,
    the Transformer's trained WordPiece, or the pretrained weights' own tokenizer (`model_config`'s
    `pretrained.path`; `texts` not read). The trainer passes its prepared training text
    (convsts.ray_jobs.training.data_feed.build_tokenizer, which counts the DAN's words itself, in Ray Data for a large folder);
    benches pass sample sentences."""
    cls: Any = TOKENIZERS[kind]  # the kinds fit differently: from counts, by training, from the model
    if hasattr(cls, "from_model"):
        return cls.from_model(model_config, config)
    if cls.fits_from_counts:
        return cls.build(count_words(texts, config.lowercase), config)
    return cls.train(texts, config)


def tokenizer_from_dict(data: dict[str, Any]):
    if data.get("kind") not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer kind {data.get('kind')!r}: expected one of {'|'.join(TOKENIZERS)}")
    return TOKENIZERS[data["kind"]].from_dict(data)


def save_tokenizer(tokenizer, path: str | Path) -> None:
    storage.write_text(path, json.dumps(tokenizer.to_dict()))


def load_tokenizer(path: str | Path):
    return tokenizer_from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def encode_columns(tokenizer, batch: dict[str, Any], columns: dict[str, str], width: int) -> dict[str, np.ndarray]:
    """Tokenize text columns of a batch into fixed-width id columns named `<prefix>__<field>`.

    `columns` maps a text column to its prefix, e.g. {"context": "context", "response": "response"}.
    Fixed width keeps Ray Data's tensor columns rectangular across blocks.
    """
    out: dict[str, np.ndarray] = {}
    for column, prefix in columns.items():
        texts = [str(t) if t is not None else "" for t in batch[column]]
        for field_name, ids in tokenizer.encode(texts, width=width).items():
            out[f"{prefix}__{field_name}"] = ids
    return out
