#!/bin/sh
# make demo's serving part: starts the 1 prefill (W8A8) + 1 decode (W4A16)
# deployment with `pdq up`, sends a few chat prompts through the router,
# prints each answer with its TTFT and TPOT, and stops everything.
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
echo; echo "== worker and router logs =="; cat "$dir/up.log"
