"""Writes docs/config.md, the run config's reference, from the config dataclasses:
.venv/bin/python scripts/config_reference.py"""

from pathlib import Path

from convsts.ray_jobs.config.reference import render

if __name__ == "__main__":
    target = Path(__file__).resolve().parent.parent / "docs" / "config.md"
    target.write_text(render(), encoding="utf-8")
    print(f"wrote {target}")
