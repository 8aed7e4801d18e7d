#!/bin/bash
# Golden test of the evaluation report: `pdq eval report` over the committed
# raw JSON must write the same tables and headings as the committed report
# (the plots and the prose between the tables may change).
#   tests/eval_report_golden.sh PDQ SRC WORK
# SRC: a committed evaluation (docs/evaluation/cpu-2core); WORK: scratch.
set -euo pipefail
pdq=$1 src=$2 work=$3
rm -rf "$work"
mkdir -p "$work"
cp -r "$src/config.json" "$src/raw" "$work/"
if ! "$pdq" eval report --config "$work/config.json" --out "$work" > "$work/stdout" 2>&1; then
  echo "pdq eval report failed:"; cat "$work/stdout"; exit 1
fi
grep -E '^[|#]' "$src/report.md" > "$work/want.txt" || true
grep -E '^[|#]' "$work/report.md" > "$work/got.txt" || true
lines=$(wc -l < "$work/want.txt")
if [ "$lines" -lt 100 ]; then
  echo "$src/report.md has only $lines table and heading lines"; exit 1
fi
if ! diff -u "$work/want.txt" "$work/got.txt"; then
  echo "the tables written from $src/raw differ from $src/report.md's (above: - committed, + written)"
  exit 1
fi
echo "$lines table and heading lines as committed"
