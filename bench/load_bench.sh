#!/usr/bin/env bash
# Serving under load (issue 22): output tokens/s, TPOT and TTFT as closed-loop
# concurrency rises (128 tokens in, 128 out), every deployment driven by the
# same client (`pdq bench --openai`, streamed /v1/completions) in one run:
#  - pdq monolithic W4A16 (one process, 2 threads),
#  - pdq one process prefilling at W8A8 and decoding at W4A16,
#  - pdq 1 W8A8 prefill + 1 W4A16 decode worker, sharing every core (as
#    deploy/local/ starts them), and the same pinned to a core each,
#  - llama.cpp's llama-server (built beside pdq, outside the project; the
#    same model as Q4_0, 2 threads, one slot per stream of the top level).
# Rounds alternate the deployments; each level is preceded by one unmeasured
# request (pdq bench --warmup). After each pdq sweep, an overload run: Poisson
# arrivals at 4x the request rate the top level sustained, the router
# refusing requests predicted to miss a 2 s TTFT target (accepted requests'
# TTFT against it; how fast the rest were refused).
# Usage: bench/load_bench.sh BUILD [LLAMA_SERVER Q4_0_GGUF] [ROUNDS] [LEVELS]
#        (about 3 minutes per deployment and round on 2 cores)
# PREFILL_BUDGETS=B1,B2,... instead runs only the 1 prefill + 1 decode
# deployment, once per prefill worker --prefill-budget B (prompt tokens a
# prefill pass takes), without the overload runs: whether a wave of prompts
# computed in one pass is what costs that deployment throughput as
# concurrency rises.
set -euo pipefail
build="${1:-build}"
llama_server="${2:-}"
llama_model="${3:-}"
rounds="${4:-1}"
levels="${5:-1,2,4,8,16}"
bin="$build/bin"
model="${PDQ_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
top="${levels##*,}"
ttft_target=2000     # ms, the router's --ttft-target-ms in the overload run
overload_seconds=20  # of arrivals at 4x the sustained rate
load=(--input-tokens 128 --output-tokens 128 --concurrency "$levels" --requests-per-client 4)
work="$(mktemp -d /tmp/pdq-load-bench-XXXXXX)"
source "$(dirname "$0")/lib.sh"

# table FILE LABEL: one line per level, from the bench's JSON.
table() {
  python3 - "$1" "$2" <<'PY'
import json, sys
for l in json.load(open(sys.argv[1]))["levels"]:
    print(f"{sys.argv[2]:<26} c={l['concurrency']:<3} out {l['output_tokens_per_s']:7.1f} tok/s"
          f"  TPOT p50 {l['tpot_s']['p50']*1e3:6.1f} ms  TTFT p50 {l['ttft_s']['p50']*1e3:7.1f} ms"
          f"  p90 {l['ttft_s']['p90']*1e3:7.1f} ms  failed {l['requests_failed']}")
PY
}

run_pdq() {  # run_pdq NAME WORKERS-JSON ROUND [no-overload]
  log "pdq up ($1: $2); pdq bench --openai ${load[*]}"
  up "$1" "$2"
  "$bin/pdq" bench --openai "$url" --model "$model" "${load[@]}" --json "$work/$1.$3.json" \
    >"$work/$1.out"
  table "$work/$1.$3.json" "$1" | tee -a "$work/summary"
  down
  [ "${4:-}" = no-overload ] && return
  # Overload: Poisson arrivals at 4x the rate the top level sustained, with
  # the router refusing what it predicts cannot start within the target.
  local sustained
  sustained="$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['levels'][-1]['requests_per_s'])" "$work/$1.$3.json")"
  local rate
  rate="$(python3 -c "print(round(4 * $sustained, 2))")"
  log "pdq up ($1, router --ttft-target-ms $ttft_target); pdq bench --rate $rate (4 x $sustained)"
  up "$1" "$2" "[\"--ttft-target-ms\", \"$ttft_target\"]"
  "$bin/pdq" bench --router "$router" --input-tokens 128 --output-tokens 128 --rate "$rate" \
    --requests $((overload_seconds * ${rate%.*} + 8)) --ttft-target-ms "$ttft_target" \
    --json "$work/$1.overload.$3.json" >"$work/$1.overload.out"
  python3 - "$work/$1.overload.$3.json" "$1" "$sustained" "$ttft_target" <<'PY' | tee -a "$work/summary"
import json, sys
l = json.load(open(sys.argv[1]))["levels"][0]
ok, refused = l["requests_ok"], l["requests_refused"]
print(f"{sys.argv[2]:<26} overload {l['rate']:.2f} req/s (4 x {float(sys.argv[3]):.2f}): "
      f"{ok} accepted, TTFT p50 {l['ttft_s']['p50']*1e3:.0f} ms p90 {l['ttft_s']['p90']*1e3:.0f} ms "
      f"(target {sys.argv[4]} ms), TPOT p50 {l['tpot_s']['p50']*1e3:.0f} ms, "
      f"{l['output_tokens_per_s']:.1f} tokens/s; "
      f"{refused} refused in p50 {l['refusal_s']['p50']*1e3:.1f} ms "
      f"p90 {l['refusal_s']['p90']*1e3:.1f} ms p99 {l['refusal_s']['p99']*1e3:.1f} ms; "
      f"other failures {l['requests_failed'] - refused}")
PY
  down
}

run_llama() {  # run_llama ROUND
  log "llama-server -m $llama_model -t 2 -tb 2 -np $top -c $((top * 512)); pdq bench --openai ${load[*]}"
  llama_up "$llama_server" "$llama_model" "$top" $((top * 512))
  "$bin/pdq" bench --openai "$llama_url" --model "$model" "${load[@]}" \
    --json "$work/llama.$1.json" >"$work/llama.bench.out"
  table "$work/llama.$1.json" "llama-server (Q4_0)" | tee -a "$work/summary"
  down
}

lscpu | grep -E '^Model name' >&2
if [ -n "${PREFILL_BUDGETS:-}" ]; then
  for r in $(seq "$rounds"); do
    echo "round $r" | tee -a "$work/summary"
    for b in ${PREFILL_BUDGETS//,/ }; do
      run_pdq "1p1d-budget-$b" \
        "[{\"role\": \"prefill\", \"precision\": \"w8a8\", \"threads\": 1, \"cpus\": \"0\",
           \"args\": [\"--prefill-budget\", \"$b\"]},
          {\"role\": \"decode\", \"precision\": \"w4a16\", \"threads\": 1, \"cpus\": \"1\"}]" \
        "$r" no-overload
    done
  done
  echo
  cat "$work/summary"
  exit 0
fi
for r in $(seq "$rounds"); do
  echo "round $r" | tee -a "$work/summary"
  run_pdq mono-w4a16 '[{"role": "both", "precision": "w4a16", "threads": 2}]' "$r"
  [ -n "$llama_server" ] && run_llama "$r"
  run_pdq mono-w8a8+w4a16 \
    '[{"role": "both", "precision": "w4a16", "threads": 2, "args": ["--prefill-precision", "w8a8"]}]' "$r"
  # 1P+1D as deploy/local/ starts it: both workers on every core, sharing
  # them; then each pinned to a core of its own, for comparison.
  run_pdq 1p1d-w8a8-w4a16 \
    '[{"role": "prefill", "precision": "w8a8"}, {"role": "decode", "precision": "w4a16"}]' "$r"
  run_pdq 1p1d-pinned \
    '[{"role": "prefill", "precision": "w8a8", "threads": 1, "cpus": "0"},
      {"role": "decode", "precision": "w4a16", "threads": 1, "cpus": "1"}]' "$r" no-overload
done
echo
cat "$work/summary"
