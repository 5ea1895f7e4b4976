#!/usr/bin/env bash
# Create .venv with the locked dependencies and install convsts into it (idempotent).
# uv with bytecode compilation (Ray workers re-import everything; without .pyc each start is ~3x
# slower here); falls back to pip. torch is the CPU build from the machine's local wheel folder
# (PIP_FIND_LINKS or pip's configured find-links).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
FL="${PIP_FIND_LINKS:-$("$PY" -m pip config get global.find-links 2>/dev/null || true)}"
stamp=".venv/.convsts-$(cat requirements.lock pyproject.toml | sha1sum | cut -c1-16)"
if [ -f "$stamp" ] && [ -x .venv/bin/convsts ]; then
  exit 0
fi
links=()
if [ -n "$FL" ]; then links=(--find-links "$FL"); fi
echo "[bootstrap] installing into .venv (python: $PY, find-links: ${FL:-none})"
if { [ -x .venv-tools/bin/uv ] || { "$PY" -m venv .venv-tools && .venv-tools/bin/pip install -q 'uv==0.13.9'; }; } \
   && .venv-tools/bin/uv venv -q --allow-existing -p "$PY" .venv \
   && VIRTUAL_ENV="$PWD/.venv" .venv-tools/bin/uv pip install -q --compile-bytecode "${links[@]}" -r requirements.lock \
   && VIRTUAL_ENV="$PWD/.venv" .venv-tools/bin/uv pip install -q --no-deps -e .; then
  :
else
  echo "[bootstrap] uv failed; falling back to pip"
  rm -rf .venv
  "$PY" -m venv .venv
  .venv/bin/pip install -q "${links[@]}" -r requirements.lock
  .venv/bin/pip install -q --no-deps -e .
fi
# The project's own modules compiled too (an editable install compiles none, and PYTHONDONTWRITEBYTECODE
# may keep Python from writing them): every Ray worker that unpickles a convsts function imports them.
# A module edited later is compiled in memory again, as Python checks each .pyc against its source.
.venv/bin/python -m compileall -q -j 0 convsts ray_jobs models datasets tune_spaces tests >/dev/null
rm -f .venv/.convsts-*
touch "$stamp"
echo "[bootstrap] done"
