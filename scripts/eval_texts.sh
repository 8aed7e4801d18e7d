#!/usr/bin/env bash
# Makes the evaluation's extra texts from what Debian's packages install, at
# set-up time (they are never copied into the repository):
#   DIR/debian-faq.en.txt   the Debian FAQ (package debian-faq), a
#                           question-and-answer document, for perplexity
#
#   scripts/eval_texts.sh [DIR]      (default build/eval-texts; `make eval-texts`)
set -euo pipefail

if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
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
