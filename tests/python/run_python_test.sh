#!/usr/bin/env bash
# Runs a Python test with the virtual environment scripts/python_env.sh made
# (ctest passes its path first); exits 77, which ctest counts as skipped,
# where that environment does not exist.
set -euo pipefail
pyenv="$1"
shift
if [ ! -x "$pyenv/bin/python" ]; then
  echo "SKIPPED: no Python environment at $pyenv (make pyenv, or scripts/python_env.sh $pyenv," \
       "needs python3-venv and PyPI)"
  exit 77
fi
exec "$pyenv/bin/python" "$@"
