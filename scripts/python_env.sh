#!/usr/bin/env bash
# Creates (or updates) the virtual environment the Python-driven tests use,
# from scripts/requirements-test.txt, at $1 (default build/pyenv). Does
# nothing when the environment already holds exactly those requirements.
# Without PyPI it says so and exits 0: the tests that need it skip.
set -euo pipefail

dest="${1:-build/pyenv}"
here="$(cd "$(dirname "$0")" && pwd)"
reqs="$here/requirements-test.txt"
stamp="$dest/.pdq-requirements"

if [ -x "$dest/bin/python" ] && [ -f "$stamp" ] && cmp -s "$reqs" "$stamp"; then
  echo "pyenv: $dest up to date"
  exit 0
fi
if ! /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null; then
  echo "pyenv: python3-venv is missing (scripts/install_deps.sh installs it);" \
       "tests that need Python packages will skip" >&2
  exit 0
fi
echo "pyenv: creating $dest from $(basename "$reqs")"
rm -rf "$dest"
/usr/bin/python3 -m venv "$dest"
if ! "$dest/bin/python" -m pip install --quiet --disable-pip-version-check -r "$reqs"; then
  echo "pyenv: could not install from PyPI; tests that need Python packages will skip" >&2
  rm -rf "$dest"
  exit 0
fi
cp "$reqs" "$stamp"
echo "pyenv: $dest ready"
