#!/usr/bin/env bash
# Cache-aware routing (bench/RESULTS.md, "Conversations"): 2 monolithic FP16
# workers (1 core each) behind one router, 8 concurrent conversations of 6
# turns, the router's --cache-load-tokens L varied: 512 (the default), 0 (the
# cached prefix and queued tokens only) and 100000 (load only, the cache
# cannot outweigh one request). About 4 minutes on 2 cores.
# Usage: bench/routing_bench.sh [BUILD]   (from the repository root)
set -euo pipefail
build="${1:-build}"
bin="$build/bin"
model="${PDQ_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
work="$(mktemp -d /tmp/pdq-routing-bench-XXXXXX)"
source "$(dirname "$0")/lib.sh"

workers='[{"role": "both", "precision": "fp16", "threads": 1, "cpus": "0"},
          {"role": "both", "precision": "fp16", "threads": 1, "cpus": "1"}]'
for L in 512 0 100000; do
  log "pdq up (2 x monolithic FP16, router --cache-load-tokens $L); pdq bench --workload conversation"
  up "route-$L" "$workers" "[\"--cache-load-tokens\", \"$L\"]"
  "$bin/pdq" bench --router "$router" --workload conversation --sessions 8 --turns 6 \
    --first-tokens 512 --turn-tokens 64 --output-tokens 64 --json "$work/route-$L.json" \
    >"$work/route-$L.txt" 2>&1
  down
  python3 - "$L" "$work/route-$L.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[2]))["conversation"]
t = c["per_turn"]
p = sum(x["prompt_tokens_mean"] for x in t[1:]); k = sum(x["cached_tokens_mean"] for x in t[1:])
print(f"L={sys.argv[1]:>6}: all done {c['seconds']:.1f} s, TTFT p50 turns 2+ {c['ttft_later_turns_s']['p50']*1e3:.0f} ms, cached {100*k/p:.0f}% of later turns' prompts")
PY
done
