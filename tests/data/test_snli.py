import json

import pandas as pd
import pytest

from convsts.datasets.snli import LABEL_IDS, read_snli, take_fraction, with_fraction_rank
from convsts.io.errors import BadInputError


def _frame(n):
    return pd.DataFrame(
        {
            "premise": [f"p{i}" for i in range(n)],
            "hypothesis": [f"h{i}" for i in range(n)],
            "label": [i % 3 for i in range(n)],
        }
    )


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
    rows = [
        {"sentence1": "A man.", "sentence2": "A person.", "gold_label": "entailment"},
        {"sentence1": "A dog.", "sentence2": "A cat.", "gold_label": "-"},
        {"sentence1": "Kids.", "sentence2": "Adults.", "gold_label": "contradiction"},
    ]
    path = tmp_path / "snli_1.0_dev.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    df = read_snli(path)
    assert list(df["label"]) == [LABEL_IDS["entailment"], LABEL_IDS["contradiction"]]
    assert df.attrs["without_gold"] == 1


def test_hugging_face_export_with_integer_labels(tmp_path):
    """premise/hypothesis/label with labels 0-2 and -1 for no gold label (Hugging Face's snli);
    any other integer is refused, not left out as if it had no gold label."""
    path = tmp_path / "snli_validation.parquet"
    pd.DataFrame({"premise": ["a", "b", "c"], "hypothesis": ["d", "e", "f"], "label": [2, -1, 0]}).to_parquet(path)
    df = read_snli(path)
    assert list(df["label"]) == [2, 0] and list(df["premise"]) == ["a", "c"] and df.attrs["without_gold"] == 1
    tsv = tmp_path / "snli_validation.tsv"  # the same export written as text
    tsv.write_text("premise\thypothesis\tlabel\na\td\t2\nb\te\t-1\nc\tf\t0\n")
    pd.testing.assert_frame_equal(read_snli(tsv), df)
    pd.DataFrame({"premise": ["a", "b"], "hypothesis": ["d", "e"], "label": [1, 3]}).to_parquet(path)
    with pytest.raises(ValueError, match=r"snli_validation.parquet: row 2: unknown label 3 \(expected one of"):
        read_snli(path)
    pd.DataFrame({"premise": ["a"], "text_b": ["d"], "label": [1]}).to_parquet(path)
    with pytest.raises(
        ValueError,
        match=r"snli_validation.parquet: no hypothesis column; expected one of \['sentence2', 'hypothesis'\]",
    ):
        read_snli(path)


def test_official_txt_and_bad_label(tmp_path):
    path = tmp_path / "snli_1.0_test.txt"
    path.write_text(
        'gold_label\tsentence1_binary_parse\tsentence1\tsentence2\nneutral\t( x )\tA "quoted" man.\tSomeone.\n'
    )
    assert read_snli(path)["premise"][0] == 'A "quoted" man.'
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"premise": "a", "hypothesis": "b", "label": "maybe"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl: row 1: unknown label 'maybe'"):
        read_snli(bad)


def test_a_txt_row_with_a_field_too_many_is_one_line_naming_the_file_and_line(tmp_path):
    path = tmp_path / "snli_1.0_train.txt"
    path.write_text("gold_label\tsentence1\tsentence2\nneutral\tA man.\tSomeone.\nneutral\tA man.\tSomeone.\textra\n")
    with pytest.raises(
        BadInputError, match=r"snli_1.0_train.txt: not a tab-separated SNLI table: Expected 3 fields in line 3, saw 4$"
    ):
        read_snli(path)
