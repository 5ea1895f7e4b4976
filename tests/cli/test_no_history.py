"""Code, tests and docs say what is, not what was: no "(before: ...)" notes, issue numbers, commit
hashes or dates of changes (history lives in git). An issue of another project cited as
owner/repo#N is a reference, not our history; dates inside names (a checkpoint folder's time stamp,
a file named by its day) are data."""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUFFIXES = (".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".cfg", ".txt")
HISTORY = {
    "a note of what it was before": re.compile(
        r"\(before[:,] (?![\w.]+[\[(),.])|(?:^|[.;:]\s|\"\"\"|#\s)\s*[Bb]efore[:,] (?!after\b)"
    ),
    "an issue number": re.compile(r"(?<![\w/.&-])#\d{1,4}\b|\b[Ii]ssues? #?\d+\b"),
    "a commit hash": re.compile(r"\bcommit(?:s)? [0-9a-f]{7,40}\b"),
    "a date": re.compile(r"(?<![\w-])20\d\d-[01]\d-[0-3]\d(?![\w-])"),
}


def _files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [REPO / f for f in listed.split() if f.endswith(SUFFIXES)]


def history_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, the line) for each line that tells history."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in HISTORY.items():
            if pattern.search(line):
                found.append((number, what, line.strip()))
    return found


def test_no_history_in_code_tests_or_docs():
    found = [
        f"{path.relative_to(REPO)}:{number}: {what}: {line[:140]}"
        for path in _files()
        if path.name != Path(__file__).name
        for number, what, line in history_lines(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert not found, "history belongs in git:\n" + "\n".join(found)


def test_the_history_check_tells_history_from_data_and_references():
    told = history_lines(
        "r = 0.0 (before: an overflow)\nBefore, the reader asked 8 KiB\nsee issue #16\nmeasured at commit 54acd6a\n"
        "### Hard negatives (2026-11-23)\n"
    )
    assert [what for _, what, _ in told] == [
        "a note of what it was before", "a note of what it was before", "an issue number", "a commit hash", "a date",
    ]  # fmt: skip
    data = "ray-project/ray#59852\ncheckpoint_2026-11-27_10-00-01.000001\nbooks_2015-02-02.json\nbefore, after = a, b\n"
    data += "def f(before: dict, after: dict):\nmax(before, other.size())\nthe step before it\nit&#39;s\n"
    assert history_lines(data) == []
