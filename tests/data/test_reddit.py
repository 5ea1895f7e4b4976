import json

import pandas as pd
import pytest

from convsts.datasets.config import RedditFilterConfig
from convsts.datasets.reddit import annotate_pairs, detect_format, failing_rule, read_pairs_file, split_of, thread_keys

CFG = RedditFilterConfig()


@pytest.mark.parametrize(
    "text, author, rule",
    [
        ("a" * 349, None, ""),  # 349 characters: kept
        ("a" * 350, None, "too_long"),  # 350 or more: removed
        ("abcdefg123", None, ""),  # alpha share 0.7... 7/10 = 0.7 -> removed? see next
        ("abcdefgh12", None, ""),  # 0.8 > 0.7: kept
        ("abcdefg 12", None, "low_alpha"),  # 7/10 = 0.7 <= 0.7: removed
        ("", None, "low_alpha"),
        ("https://example.com nice", None, "banned_prefix"),
        ("/r/pics is great", None, "banned_prefix"),
        ("@someone hello there", None, "banned_prefix"),
        ("see https://x.org later", None, ""),  # only a leading https counts
        ("[deleted]", None, "deleted"),
        ("[removed]", None, "deleted"),
        ("hello there friend", "AutoModerator_bot", "bot_author"),
        ("hello there friend", "RoBOTics", "bot_author"),  # the paper's rule is a plain substring
        ("hello there friend", "alice", ""),
    ],
)
def test_filter_rules_at_their_boundaries(text, author, rule):
    if text == "abcdefg123":
        rule = "low_alpha"  # 7 letters of 10 characters: share 0.7, removed (<= 0.7)
    assert failing_rule(text, author, CFG) == rule


def test_split_is_deterministic_and_near_the_share():
    keys = [f"thread-{i}" for i in range(4000)]
    first = [split_of(k, 0.1) for k in keys]
    assert first == [split_of(k, 0.1) for k in keys]
    share = first.count("test") / len(first)
    assert 0.08 < share < 0.12
    assert split_of("x", 0.1, salt="a") == split_of("x", 0.1, salt="a")


def test_thread_keys_follow_replies_to_the_root():
    group = pd.DataFrame(
        {
            "context": ["Title of post", "first comment", "first comment", "other title"],
            "response": ["first comment", "reply one", "reply two", "lonely reply"],
            "subreddit": ["books"] * 4,
        }
    )
    keys = thread_keys(group)
    assert keys[0] == keys[1] == keys[2] == "books|title of post"
    assert keys[3] == "books|other title"


def test_annotate_keeps_a_thread_on_one_side():
    group = pd.DataFrame(
        {
            "context": ["Root title here", "a comment here", "a comment here"],
            "response": ["a comment here", "a reply here", "x" * 400],
            "group": ["f1"] * 3,
            "subreddit": ["s"] * 3,
            "source": ["f:1", "f:2", "f:3"],
            "status": ["", "", ""],
        }
    )
    out = annotate_pairs(group, CFG, 0.5, "salt")
    assert list(out["status"]) == ["", "", "too_long"]
    assert out["split"][0] == out["split"][1] and out["split"][2] == ""


def test_read_pairs_jsonl_counts_malformed_lines(tmp_path):
    path = tmp_path / "pairs.jsonl"
    lines = [
        json.dumps({"context": "hello there", "response": "general kenobi"}),
        "{not json",
        json.dumps({"context": None, "response": "x"}),
        json.dumps(["a", "list"]),
    ]
    path.write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe\n")
    df = read_pairs_file(str(path))
    assert len(df) == 5
    assert sorted(df["status"]) == ["", "malformed", "malformed", "malformed", "malformed"]
    bad = df[df["status"] == "malformed"]["source"].tolist()
    assert f"{path}:2" in bad and f"{path}:5" in bad


def test_detect_format(tmp_path):
    dump = tmp_path / "RC_2015-01.ndjson"
    dump.write_text(json.dumps({"id": "a", "parent_id": "t3_x", "link_id": "t3_x", "author": "u", "body": "hi"}) + "\n")
    pairs = tmp_path / "p.jsonl"
    pairs.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    notjson = tmp_path / "notes.txt"
    notjson.write_text("just some text\n")
    assert detect_format(str(dump)) == "pushshift"
    assert detect_format(str(pairs)) == "pairs"
    with pytest.raises(ValueError, match="notes.txt.*not NDJSON"):
        detect_format(str(notjson))
