"""docs/config.md is the run config's reference as the code makes it, and every key says what it is."""

from pathlib import Path

from convsts.io.dotted import flatten
from convsts.ray_jobs.config.reference import entries, render
from convsts.ray_jobs.config.schema import RunConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_every_key_of_the_run_config_is_documented():
    documented = {key: comment for key, _, _, comment in entries()}
    # Every key a run config holds is a documented key or inside one (a dict or list value).
    for key in flatten(RunConfig().to_dict()):
        assert any(key == d or key.startswith(f"{d}.") for d in documented), key
    assert [key for key, comment in documented.items() if not comment] == []


def test_the_reference_page_is_the_one_the_code_makes():
    assert DOC.read_text(encoding="utf-8") == render(), "run: .venv/bin/python scripts/config_reference.py"
