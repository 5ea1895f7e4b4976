#!/usr/bin/env bash
# mypy on the whole `convsts` package (pyproject's [tool.mypy]): convsts/datasets, convsts/models,
# convsts/ray_jobs and convsts/tune_spaces are links to the repository's top-level folders, so mypy,
# editors and other static tools read the package as Python imports it. Then basedpyright
# (pyproject's [tool.basedpyright]): every import of the package, the tests and the benchmarks
# resolves for a pyright-based editor from the source tree. Extra arguments go to mypy.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/mypy --cache-dir build/mypy_cache "$@" -p convsts
# --project: pyright would take a pyrightconfig.json found in a folder above before this pyproject.toml.
.venv/bin/basedpyright --project pyproject.toml
