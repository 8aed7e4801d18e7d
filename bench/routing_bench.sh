#!/usr/bin/env bash
# Cache-aware routing (bench/RESULTS.md, "Conversations"): 2 monolithic FP16
# workers (1 core each) behind one router, 8 concurrent conversations of 6
# turns, the router's --cache-load-tokens L varied: 512 (the default), 0 (the
# cached prefix and queued tokens only) and 100000 (load only, the cache
# cannot outweigh one request). About 4 minutes on 2 cores.
# Usage: bench/routing_bench.sh   (from the repository root, after make build)
set -euo pipefail
for L in 512 0 100000; do
  printf '{"model": "models/SmolLM2-135M-Instruct.Q4_1.gguf", "listen": "127.0.0.1:0", "router_args": ["--cache-load-tokens", "%s"], "workers": [{"role": "both", "precision": "fp16", "threads": 1, "cpus": "0"}, {"role": "both", "precision": "fp16", "threads": 1, "cpus": "1"}]}\n' "$L" > "${TMPDIR:-/tmp}"/route-$L.json
  rm -f "${TMPDIR:-/tmp}"/route.addr
  build/bin/pdq up --config "${TMPDIR:-/tmp}"/route-$L.json --address-file "${TMPDIR:-/tmp}"/route.addr > "${TMPDIR:-/tmp}"/route-up.log 2>&1 &
  pid=$!
  for _ in $(seq 120); do [ -s "${TMPDIR:-/tmp}"/route.addr ] && break; sleep 0.5; done
  build/bin/pdq bench --router "$(cat "${TMPDIR:-/tmp}"/route.addr)" --workload conversation --sessions 8 --turns 6 \
    --first-tokens 512 --turn-tokens 64 --output-tokens 64 --json "${TMPDIR:-/tmp}"/route-$L.out.json > "${TMPDIR:-/tmp}"/route-$L.txt 2>&1
  kill $pid; wait $pid || true
  python3 - "$L" "${TMPDIR:-/tmp}"/route-$L.out.json <<'PY'
import json, sys
c = json.load(open(sys.argv[2]))["conversation"]
t = c["per_turn"]
p = sum(x["prompt_tokens_mean"] for x in t[1:]); k = sum(x["cached_tokens_mean"] for x in t[1:])
print(f"L={sys.argv[1]:>6}: all done {c['seconds']:.1f} s, TTFT p50 turns 2+ {c['ttft_later_turns_s']['p50']*1e3:.0f} ms, cached {100*k/p:.0f}% of later turns' prompts")
PY
done
