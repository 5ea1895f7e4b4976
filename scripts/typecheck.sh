#!/usr/bin/env bash
# mypy on the whole `convsts` package (pyproject's [tool.mypy]): convsts/datasets, convsts/models,
# convsts/ray_jobs and convsts/tune_spaces are links to the repository's top-level folders, so mypy,
# editors and other static tools read the package as Python imports it. Then basedpyright
# (pyproject's [tool.basedpyright]): every import of the package, the tests and the benchmarks
# resolves for a pyright-based editor from the source tree. Extra arguments go to mypy.
# The two run side by side (each uses about one core; mypy takes the longer), each printing its own
# report whole; the script fails if either does.
set -uo pipefail
cd "$(dirname "$0")/.."
pyright_log="$(mktemp)"
trap 'rm -f "$pyright_log"' EXIT
# --project: pyright would take a pyrightconfig.json found in a folder above before this pyproject.toml.
.venv/bin/basedpyright --project pyproject.toml > "$pyright_log" 2>&1 &
pyright_pid=$!
.venv/bin/mypy --cache-dir build/mypy_cache "$@" -p convsts
mypy_rc=$?
wait "$pyright_pid"
pyright_rc=$?
cat "$pyright_log"
[ "$mypy_rc" -eq 0 ] && [ "$pyright_rc" -eq 0 ]
