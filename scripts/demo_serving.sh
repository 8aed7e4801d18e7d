#!/bin/sh
# make demo's serving part: starts the 1 prefill (W8A8) + 1 decode (W4A16)
# deployment with `pdq up`, sends a few chat prompts through the router,
# prints each answer with its TTFT and TPOT, shows the workers (pdq
# status), runs a small load test (pdq bench), and stops everything.
set -eu
BUILD=${1:-build}
PDQ="$BUILD/bin/pdq"
CONFIG=${CONFIG:-deploy/local/1p1d-w8a8-w4a16.json}
dir=$(mktemp -d)
cleanup() {
  [ -n "${up:-}" ] && kill -TERM "$up" 2>/dev/null && wait "$up" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT INT TERM
"$PDQ" up --config "$CONFIG" --address-file "$dir/addr" > "$dir/up.log" 2>&1 &
up=$!
i=0
while [ ! -s "$dir/addr" ]; do
  if ! kill -0 "$up" 2>/dev/null || [ $i -ge 1200 ]; then
    cat "$dir/up.log"; echo "demo: pdq up did not come up"; exit 1
  fi
  i=$((i + 1)); sleep 0.1
done
addr=$(cat "$dir/addr")
echo "router at $addr ($CONFIG)"
for p in "What is the capital of France?" \
         "Explain in two sentences why the sky is blue." \
         "Write a haiku about the sea."; do
  echo; echo "> $p"
  "$PDQ" client --router "$addr" --chat --max-tokens 64 --prompt "$p"
done
echo; echo "== pdq status =="
"$PDQ" status --router "$addr"
text=../shared/data/wikitext-2-raw/wiki.test.raw
[ -f "$text" ] || text=README.md
echo; echo "== pdq bench: 128-token prompts of $text, 32 tokens out, 1 and 4 clients =="
"$PDQ" bench --router "$addr" --concurrency 1,4 --requests 8 --warmup 1 \
  --input-tokens 128 --output-tokens 32 --text "$text" 2>/dev/null
echo; echo "== worker and router logs =="; cat "$dir/up.log"
