#!/usr/bin/env bash
# mypy on convsts.models and convsts.datasets (pyproject's [tool.mypy]). The subpackages live in the
# repository's top-level folders (installed under `convsts` by package-dir), so mypy reads them
# through a tree of links laid out as the installed package is.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=build/typecheck/convsts
rm -rf build/typecheck && mkdir -p "$tree"
cp convsts/__init__.py "$tree/__init__.py"
for folder in datasets models ray_jobs tune_spaces; do ln -s "$PWD/$folder" "$tree/$folder"; done
MYPYPATH=build/typecheck exec .venv/bin/mypy --cache-dir build/mypy_cache "$@" -p convsts.models -p convsts.datasets
