import json
import os
import subprocess
import sys

import numpy as np
import pytest

from convsts.datasets.config import TokenizerConfig
from convsts.datasets.text import (
    DanTokenizer,
    SubwordTokenizer,
    count_words,
    fit_tokenizer,
    load_tokenizer,
    normalize,
    save_tokenizer,
    words,
)
from convsts.models.encoders import encoder_class


def test_normalize_unescapes_and_marks_urls():
    assert normalize("A &gt; B  see https://x.org/a?b") == "a > b see <url>"
    assert words("Don't stop!") == ["don't", "stop", "!"]


def test_fit_tokenizer_gives_each_encoder_the_tokenizer_the_trainer_fits():
    texts = ["the cat sat on the mat", "unbelievably long words", "the dog"] * 4
    config = TokenizerConfig(bigram_buckets=100, subword_vocab_size=60, min_count=1)
    dan = fit_tokenizer(encoder_class("dan").tokenizer_kind, iter(texts), config)  # any iterable, read once
    assert isinstance(dan, DanTokenizer) and dan.vocab == DanTokenizer.build(count_words(texts), config).vocab
    # The Transformer's WordPiece, not the DAN's words: a word outside its small vocabulary comes in pieces.
    pieces = fit_tokenizer(encoder_class("transformer").tokenizer_kind, texts, config)
    assert isinstance(pieces, SubwordTokenizer)
    assert (pieces.encode(["unbelievably"])["ids"] > 0).sum() > 1 and pieces.num_words <= 60
    with pytest.raises(KeyError):
        fit_tokenizer("no-such-kind", texts, config)


def test_dan_tokenizer_ids_padding_and_bigrams():
    tok = DanTokenizer.build(count_words(["the cat sat", "the dog"]), TokenizerConfig(bigram_buckets=100))
    assert tok.vocab[0] == "the"  # most frequent first; ties by the word
    out = tok.encode(["the cat sat", "zebra", ""])
    assert out["words"].shape == (3, 3) and out["bigrams"].shape == (3, 3)
    assert out["words"][1, 0] == 1 and (out["words"][1, 1:] == 0).all()  # <unk>, then padding
    assert (out["bigrams"][0, :2] > 0).all() and out["bigrams"][0, 2] == 0  # 2 bigrams for 3 words
    assert (out["words"][2] == 0).all()
    # Bigram ids are stable across tokenizers built alike (crc32 and a fixed mix, not Python's hash).
    again = DanTokenizer.build(count_words(["the cat sat", "the dog"]), TokenizerConfig(bigram_buckets=100))
    assert np.array_equal(again.encode(["the cat sat"])["bigrams"], out["bigrams"][:1, :3])


def test_bigram_codes_keep_unknown_words_apart_and_do_not_depend_on_the_batch():
    cfg = TokenizerConfig(bigram_buckets=1000, max_words=8)
    tok = DanTokenizer.build(count_words(["the cat sat on the mat"]), cfg)
    out = tok.encode(["the cat sat on the mat", "the zebra sat", "the okapi sat", "the cat"])
    words_, bigrams = out["words"], out["bigrams"]  # (4, 6) each
    assert ((bigrams >= 0) & (bigrams < 1000)).all() and (bigrams[:, :-1][words_[:, 1:] > 0] > 0).all()
    assert (bigrams[words_ == 0] == 0).all() and (bigrams[np.arange(4), (words_ > 0).sum(1) - 1] == 0).all()
    assert words_[1, 1] == words_[2, 1] == 1  # both unknown words are <unk> ...
    assert bigrams[1, 0] != bigrams[2, 0] and bigrams[1, 1] != bigrams[2, 1]  # ... but their bigrams differ
    assert bigrams[0, 0] == bigrams[3, 0]  # "the cat" in either row
    alone = tok.encode(["the zebra sat"], width=20)  # another batch, another width: the same ids
    assert np.array_equal(alone["bigrams"][0, :2], bigrams[1, :2]) and np.array_equal(
        alone["words"][0, :3], words_[1, :3]
    )


def test_bigram_ids_are_the_same_in_another_process(tmp_path):
    """Hashing does not use Python's per-process hash seed: a Ray Data worker computes the ids the
    checkpoint was trained with."""
    tok = DanTokenizer.build(count_words(["the cat sat on the mat"]), TokenizerConfig(bigram_buckets=1000))
    save_tokenizer(tok, tmp_path / "tok.json")
    code = (
        f"import json; from convsts.datasets.text import load_tokenizer; "
        f"print(json.dumps(load_tokenizer({str(tmp_path / 'tok.json')!r}).encode(['the zebra sat on a mat'])['bigrams'].tolist()))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    other = json.loads(
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    )
    assert other == tok.encode(["the zebra sat on a mat"])["bigrams"].tolist()


def test_a_tokenizer_of_another_bigram_scheme_is_refused(tmp_path):
    other = DanTokenizer.build(count_words(["the cat sat"]), TokenizerConfig(bigram_buckets=1000)).to_dict()
    del other["bigram_hash"]  # a JSON that does not name the scheme its bigram ids were hashed with
    (tmp_path / "tok.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="bigram_hash: expected codes, got None"):
        load_tokenizer(tmp_path / "tok.json")


def test_vocab_limit_and_round_trip(tmp_path):
    cfg = TokenizerConfig(word_vocab_size=2, bigram_buckets=50, max_words=4)
    tok = DanTokenizer.build(count_words(["a a a b b c"]), cfg)
    assert tok.vocab == ["a", "b"] and tok.num_words == 4
    assert tok.encode(["a b c d e f"])["words"].shape == (1, 4)  # truncated at max_words
    save_tokenizer(tok, tmp_path / "tok.json")
    loaded = load_tokenizer(tmp_path / "tok.json")
    assert np.array_equal(loaded.encode(["a c b"])["words"], tok.encode(["a c b"])["words"])


def test_subword_tokenizer_trains_and_round_trips(tmp_path):
    texts = ["the quick brown fox jumps", "a quick brown dog", "foxes and dogs"] * 20
    tok = SubwordTokenizer.train(texts, TokenizerConfig(subword_vocab_size=120))
    ids = tok.encode(["quick foxes", "dog"])["ids"]
    assert ids.shape[0] == 2 and (ids[1, -1] == 0)  # padded with [PAD] = 0
    save_tokenizer(tok, tmp_path / "sub.json")
    assert np.array_equal(
        load_tokenizer(tmp_path / "sub.json").encode(["quick foxes"], width=ids.shape[1])["ids"], ids[:1]
    )


def test_the_exported_normalizer_gives_what_normalize_gives_on_any_text():
    """hf_normalizer (in the sentence-transformers folder's tokenizer.json) against `normalize` on
    texts built at random from every HTML5 name, legacy names without ";", numeric references,
    ampersands and semicolons that meet, URLs, spaces and the normalizer's own held characters;
    `unescape` is html.unescape wherever a numeric reference is not involved."""
    import html
    import random

    from convsts.datasets.text import HOLD, KEPT, hf_normalizer, unescape

    names = sorted(html.entities.html5)
    fragments = ["&", ";", "#", "x", "26", "38", "39", "3939", "x27", "8217", "200B", "amp", "AMP", "semi", "not",
                 "a", " ", "\t\n", "http://x.y/", "é", HOLD, KEPT, "\ufdd1"]  # fmt: skip
    exported, rng = hf_normalizer(), random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(fragments + rng.sample(names, 5)) for _ in range(rng.randint(1, 10)))
        assert exported.normalize_str(text) == normalize(text, lowercase=False), text
        if "#" not in text:
            assert unescape(text) == html.unescape(text), text
    for name in names:  # each name alone, and followed by text that could lengthen it
        for text in (f"&{name}", f"&{name}x;", f"a&{name}&{name}"):
            assert exported.normalize_str(text) == normalize(text, lowercase=False), text
