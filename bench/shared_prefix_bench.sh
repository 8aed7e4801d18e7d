#!/usr/bin/env bash
# Chat load with a shared system prompt on 1P+1D, for bench/RESULTS.md ("A
# shared system prompt under chat load"): every request is a 256-token
# system prompt every request shares plus 128 tokens of its own, 128 out
# (`pdq bench --shared-prefix-tokens`). The decode worker holds the system
# prompt's blocks from earlier requests, so the router may let it prefill
# the 128 missing tokens itself (--local-prefill-tokens, default 256; for a
# pair of two precisions only when it holds at least as many tokens as are
# missing and, since 2923c10, more than the prefill worker holds) instead of
# sending the prompt to the prefill worker. Each round
# runs both 1P+1D pairs with the router's default and with
# --local-prefill-tokens 0 (always the prefill worker), alternated; per
# level: output tokens/s, TTFT p50/p90, TPOT p50, and the prompt tokens each
# worker computed.
# Usage: bench/shared_prefix_bench.sh BUILD [ROUNDS]   (about 4 minutes a round on 2 cores)
set -euo pipefail
build="${1:-build}"
rounds="${2:-1}"
bin="$build/bin"
model="${PDQ_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
load=(--input-tokens 384 --shared-prefix-tokens 256 --output-tokens 128 --concurrency 4,8
      --requests-per-client 4)
work="$(mktemp -d /tmp/pdq-shared-prefix-bench-XXXXXX)"
source "$(dirname "$0")/lib.sh"

summary() {  # summary FILE LABEL
  python3 - "$1" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for l in d["levels"]:
    by_role = ", ".join(f"{w['role']} {w['prefill_tokens']:.0f}" for w in l["workers"])
    print(f"{sys.argv[2]:<28} c={l['concurrency']:<2} {l['output_tokens_per_s']:6.1f} tok/s"
          f"  TTFT p50 {l['ttft_s']['p50']*1e3:6.0f} p90 {l['ttft_s']['p90']*1e3:6.0f} ms"
          f"  TPOT p50 {l['tpot_s']['p50']*1e3:5.1f} ms  prompt tokens computed: {by_role}")
PY
}

run() {  # run NAME WORKERS-JSON ROUTER-ARGS-JSON
  log "pdq up ($1: $2 $3); pdq bench ${load[*]}"
  up "$1" "$2" "$3"
  "$bin/pdq" bench --router "$router" "${load[@]}" --json "$work/$1.bench.json" >"$work/$1.out"
  summary "$work/$1.bench.json" "$1" | tee -a "$work/summary"
  down
}

for r in $(seq "$rounds"); do
  for pair in "w8a8 w4a16" "fp16 fp16"; do
    set -- $pair
    workers="[{\"role\": \"prefill\", \"precision\": \"$1\"}, {\"role\": \"decode\", \"precision\": \"$2\"}]"
    run "1p1d-$1-$2-local-default" "$workers" '[]'
    run "1p1d-$1-$2-local-0" "$workers" '["--local-prefill-tokens", "0"]'
  done
done
echo
echo "## Summary ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores)"
cat "$work/summary"
