#!/usr/bin/env bash
# Stall-free steps (issue 22): what bounding each step's prompt work
# (--tpot-target-ms) does to decoding streams and to prompts, for the two
# kinds of one-process worker:
#  - monolithic W4A16 (prompts and decode rows in one forward pass),
#  - one process prefilling at W8A8 and decoding at W4A16 (a prompt pass,
#    then a decode pass),
# each under every setting given (auto, off, or milliseconds), one after the
# other, rounds alternating the settings. Two loads a setting:
#  - long prompts arriving while streams decode: 2048 tokens in, 256 out,
#    4 clients, 12 requests (pdq bench --router): the gaps between a
#    stream's tokens (p99 and longest), TPOT p50, TTFT, output tokens/s;
#  - short requests in waves: 128 in, 128 out, closed loop at 8 and 16
#    clients, 4 requests each (pdq bench --openai): output tokens/s, TPOT.
# The worker's step log lines (cost model, cut-short share) are printed
# after each run.
# Usage: bench/stall_bench.sh BUILD [SETTINGS] [ROUNDS]   (SETTINGS: off,auto,50)
#        (about 4 minutes a setting and deployment on 2 cores)
set -euo pipefail
build="${1:-build}"
settings="${2:-off,auto,50}"
rounds="${3:-1}"
bin="$build/bin"
model="${PDQ_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
work="$(mktemp -d /tmp/pdq-stall-bench-XXXXXX)"
source "$(dirname "$0")/lib.sh"

long_row() {  # long_row JSON LABEL
  python3 - "$1" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
l = d["levels"][0]
gaps = [g for r in d.get("requests", []) for g in r.get("gaps_s", [])]
print(f"{sys.argv[2]:<34} long  out {l['output_tokens_per_s']:6.1f} tok/s  TPOT p50 "
      f"{l['tpot_s']['p50']*1e3:6.1f} ms  gap p99 {l['itl_s']['p99']*1e3:6.0f} ms  longest "
      f"{max(gaps)*1e3 if gaps else float('nan'):6.0f} ms  TTFT p50 {l['ttft_s']['p50']*1e3:6.0f}"
      f" p90 {l['ttft_s']['p90']*1e3:6.0f} ms  failed {l['requests_failed']}")
PY
}
short_rows() {  # short_rows JSON LABEL
  python3 - "$1" "$2" <<'PY'
import json, sys
for l in json.load(open(sys.argv[1]))["levels"]:
    print(f"{sys.argv[2]:<34} short c={l['concurrency']:<3} out {l['output_tokens_per_s']:6.1f} "
          f"tok/s  TPOT p50 {l['tpot_s']['p50']*1e3:6.1f} ms  TTFT p50 "
          f"{l['ttft_s']['p50']*1e3:6.0f} ms  failed {l['requests_failed']}")
PY
}

run() {  # run NAME WORKER-JSON-PREFIX SETTING ROUND
  local name="$1-$3" workers
  workers="[$2, \"args\": $(python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \
    "${extra[@]}" --tpot-target-ms "$3")}]"
  log "pdq up ($name: $workers)"
  up "$name" "$workers"
  "$bin/pdq" bench --router "$router" --input-tokens 2048 --output-tokens 256 --concurrency 4 \
    --requests 12 --json "$work/$name.long.$4.json" >"$work/bench.out"
  long_row "$work/$name.long.$4.json" "$name" | tee -a "$work/summary"
  "$bin/pdq" bench --openai "$url" --model "$model" --input-tokens 128 --output-tokens 128 \
    --concurrency 8,16 --requests-per-client 4 --json "$work/$name.short.$4.json" >"$work/bench.out"
  short_rows "$work/$name.short.$4.json" "$name" | tee -a "$work/summary"
  grep -hE 'step costs|steps while prompts waited' "$work/up.err" | tail -3 | cut -c1-400 |
    sed "s/^/  [$name] /" | tee -a "$work/summary"
  down
}

lscpu | grep -E '^Model name' >&2
for r in $(seq "$rounds"); do
  echo "round $r" | tee -a "$work/summary"
  for s in ${settings//,/ }; do
    extra=(--prefill-precision w8a8)
    run one-process-w8a8+w4a16 '{"role": "both", "precision": "w4a16", "threads": 2' "$s" "$r"
    extra=()
    run mono-w4a16 '{"role": "both", "precision": "w4a16", "threads": 2' "$s" "$r"
  done
done
echo
cat "$work/summary"
