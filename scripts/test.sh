#!/usr/bin/env bash
# README command 2 (and CI's): install, then lint, type-check, the unit tier, the slow tier.
#   machine speed (first): bench/machine_speed.py's one line, to read the run's times against
#               (the same machine type is up to twice as fast on one day as on another)
#   lint:       ruff check and ruff format --check (pyproject's [tool.ruff])
#   types:      mypy on the whole convsts package, basedpyright on every import (scripts/typecheck.sh)
#   unit tier:  `pytest`, no Ray (a test that starts Ray fails there)
#   slow tier:  `pytest --slow -m slow`, Ray, Ray Train / Tune jobs, servers, end to end
#   release tier (only with --release): `pytest --slow --release -m release`, the long scenarios
#               whose CI-size twins the slow tier runs (docs/testing.md)
# Each tier runs in two pytest-xdist processes (-n 2): a test waiting on Ray, a subprocess or a
# server leaves a core to the other. A scope runs whole in one process: a test file, or a folder
# whose files share a package fixture (tests/cluster/multinode/: one multi-node cluster);
# scopes go out longest first by tests/durations.json (tests/testkit/scheduling.py). After a
# change to the slow tests, `bash scripts/test.sh --store-durations` records their seconds anew.
# Extra arguments go to every pytest run, e.g. `bash scripts/test.sh -k prepare`.
set -uo pipefail
cd "$(dirname "$0")/.."
release=0
args=()
for arg in "$@"; do
  if [ "$arg" = "--release" ]; then release=1; else args+=("$arg"); fi
done
set -- ${args[@]+"${args[@]}"}
bash scripts/bootstrap.sh || exit 1
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false

stage() { echo; echo "[test] $1 ($(date -u +%H:%M:%S))"; }
tests() {  # pytest's exit code 5 (no test collected) is a failure too
  .venv/bin/python -m pytest -n 2 --dist loadscope "$@"
  local rc=$?
  if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: treating as a failure"; return 1; fi
  return "$rc"
}

stage "machine speed: bench/machine_speed.py"
.venv/bin/python bench/machine_speed.py || exit 1
stage "lint: ruff check, ruff format --check"
.venv/bin/ruff check . && .venv/bin/ruff format --check . || exit 1
stage "types: mypy on the convsts package, basedpyright on imports"
bash scripts/typecheck.sh || exit 1
stage "unit tier: no Ray"
tests --timeout=300 --durations=10 "$@" || exit 1
stage "slow tier: Ray, training, sweeps, servers"
tests --slow -m slow --timeout=900 --durations=15 "$@" || exit 1  # the 15 slowest tests last
if [ "$release" = 1 ]; then
  stage "release tier: the long scenarios"
  tests --slow --release -m release --timeout=1800 --durations=15 "$@"
fi
