import numpy as np

from datasets.text import (DanTokenizer, SubwordTokenizer, TokenizerConfig, count_words, load_tokenizer,
                           normalize, save_tokenizer, words)


def test_normalize_unescapes_and_marks_urls():
    assert normalize("A &gt; B  see https://x.org/a?b") == "a > b see <url>"
    assert words("Don't stop!") == ["don't", "stop", "!"]


def test_dan_tokenizer_ids_padding_and_bigrams():
    tok = DanTokenizer.build(count_words(["the cat sat", "the dog"]), TokenizerConfig(bigram_buckets=100))
    assert tok.vocab[0] == "the"  # most frequent first; ties by the word
    out = tok.encode(["the cat sat", "zebra", ""])
    assert out["words"].shape == (3, 3) and out["bigrams"].shape == (3, 3)
    assert out["words"][1, 0] == 1 and (out["words"][1, 1:] == 0).all()  # <unk>, then padding
    assert (out["bigrams"][0, :2] > 0).all() and out["bigrams"][0, 2] == 0  # 2 bigrams for 3 words
    assert (out["words"][2] == 0).all()
    # Bigram ids are stable (crc32), not Python's randomized hash.
    again = DanTokenizer.build(count_words(["the cat sat", "the dog"]), TokenizerConfig(bigram_buckets=100))
    assert np.array_equal(again.encode(["the cat sat"])["bigrams"], out["bigrams"][:1, :3])


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
    assert np.array_equal(load_tokenizer(tmp_path / "sub.json").encode(["quick foxes"], width=ids.shape[1])["ids"], ids[:1])
