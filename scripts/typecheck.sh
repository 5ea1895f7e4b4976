#!/usr/bin/env bash
# mypy on the whole `convsts` package (pyproject's [tool.mypy]): convsts/datasets, convsts/models,
# convsts/ray_jobs and convsts/tune_spaces are links to the repository's top-level folders, so mypy,
# editors and other static tools read the package as Python imports it.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/mypy --cache-dir build/mypy_cache "$@" -p convsts
