import json

import pandas as pd
import pytest

from datasets.snli import LABEL_IDS, read_snli, take_fraction, with_fraction_rank


def _frame(n):
    return pd.DataFrame({"premise": [f"p{i}" for i in range(n)], "hypothesis": [f"h{i}" for i in range(n)],
                         "label": [i % 3 for i in range(n)]})


def test_fractions_are_nested_and_deterministic():
    ranked = with_fraction_rank(_frame(2000), seed=3)
    previous = set()
    for tenth in range(1, 11):
        subset = set(take_fraction(ranked, tenth / 10)["premise"])
        assert previous <= subset
        assert abs(len(subset) - 200 * tenth) < 80
        previous = subset
    assert len(previous) == 2000
    again = with_fraction_rank(_frame(2000), seed=3)
    assert list(again["fraction_rank"]) == list(ranked["fraction_rank"])
    other_seed = with_fraction_rank(_frame(2000), seed=4)
    assert set(take_fraction(other_seed, 0.1)["premise"]) != set(take_fraction(ranked, 0.1)["premise"])


def test_official_jsonl_drops_gold_dash(tmp_path):
    rows = [{"sentence1": "A man.", "sentence2": "A person.", "gold_label": "entailment"},
            {"sentence1": "A dog.", "sentence2": "A cat.", "gold_label": "-"},
            {"sentence1": "Kids.", "sentence2": "Adults.", "gold_label": "contradiction"}]
    path = tmp_path / "snli_1.0_dev.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    df = read_snli(path)
    assert list(df["label"]) == [LABEL_IDS["entailment"], LABEL_IDS["contradiction"]]


def test_official_txt_and_bad_label(tmp_path):
    path = tmp_path / "snli_1.0_test.txt"
    path.write_text("gold_label\tsentence1_binary_parse\tsentence1\tsentence2\n"
                    "neutral\t( x )\tA \"quoted\" man.\tSomeone.\n")
    assert read_snli(path)["premise"][0] == 'A "quoted" man.'
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"premise": "a", "hypothesis": "b", "label": "maybe"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl: row 0: unknown label"):
        read_snli(bad)
