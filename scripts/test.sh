#!/usr/bin/env bash
# README command 2 (and CI's): install, then lint, type-check, the unit tier, the slow tier.
#   lint:       ruff check and ruff format --check (pyproject's [tool.ruff])
#   types:      mypy on the whole convsts package, basedpyright on every import (scripts/typecheck.sh)
#   unit tier:  `pytest`, no Ray (a test that starts Ray fails there)
#   slow tier:  `pytest --slow -m slow`, Ray, Ray Train / Tune jobs, servers, end to end
# Both tiers run in two pytest-xdist processes (-n 2): a test waiting on Ray, a subprocess or a
# server leaves a core to the other. Each test file runs whole in one process (--dist loadfile), so a
# module fixture (the four-node cluster of test_cluster.py) is made once. xdist hands out the
# unit tier's files with the most tests first, the slow tier's in collection order, which
# conftest.py begins with its longest files (LONGEST_FIRST). (--dist loadgroup would group by
# `xdist_group` marks, but pytest-xdist 3.8 does not apply them under pytest 9: the cluster tests
# ran in both processes, each starting its own cluster.)
# Extra arguments go to both pytest runs, e.g. `bash scripts/test.sh -k prepare`.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh || exit 1
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false

stage() { echo; echo "[test] $1 ($(date -u +%H:%M:%S))"; }
tests() {  # pytest's exit code 5 (no test collected) is a failure too
  .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
  local rc=$?
  if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: treating as a failure"; return 1; fi
  return "$rc"
}

stage "lint: ruff check, ruff format --check"
.venv/bin/ruff check . && .venv/bin/ruff format --check . || exit 1
stage "types: mypy on the convsts package, basedpyright on imports"
bash scripts/typecheck.sh || exit 1
stage "unit tier: no Ray"
tests --timeout=300 --durations=10 "$@" || exit 1
stage "slow tier: Ray, training, sweeps, servers"
tests --slow -m slow --timeout=900 --durations=15 --no-loadscope-reorder "$@"  # the 15 slowest tests last
