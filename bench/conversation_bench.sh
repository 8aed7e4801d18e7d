#!/usr/bin/env bash
# The KV-reuse figures of bench/RESULTS.md ("Conversations: KV reuse across
# turns"), each a ratio measured in this run on this machine:
#  - per deployment (monolithic FP16, W8A8+W4A16 and W4A16 on 2 threads;
#    1 prefill + 1 decode worker, FP16/FP16 and W8A8/W4A16, sharing every
#    core; W8A8/W4A16 also pinned to a core each), the conversation workload
#    with the prefix cache on and off (and, for the W8A8/W4A16 ones, with
#    exact reuse, --reuse-kv-any-precision=false): conversations finish
#    (wall time) and TTFT p50 per turn;
#  - the TTFT of a fresh prompt as long as a turn's new tokens (128: the
#    previous answer and the new message) at the same concurrency, cache on;
#  - llama.cpp's llama-server (built beside pdq, outside the project; Q4_0
#    of the same model, 2 threads, one slot per session, its prompt cache on)
#    under the same client, alternated with pdq's monolithic deployment.
# Usage: bench/conversation_bench.sh BUILD [LLAMA_SERVER Q4_0_GGUF] [ROUNDS]
#        (10-25 minutes on 2 cores with llama-server, ROUNDS=1)
set -euo pipefail
build="${1:-build}"
llama_server="${2:-}"
llama_model="${3:-}"
rounds="${4:-1}"
bin="$build/bin"
model="${PDQ_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
sessions=4 turns=8
conv=(--workload conversation --sessions "$sessions" --turns "$turns" --first-tokens 512
      --turn-tokens 64 --output-tokens 64)
work="$(mktemp -d /tmp/pdq-conversation-bench-XXXXXX)"
source "$(dirname "$0")/lib.sh"

# summary FILE LABEL: one line per run, from the bench's JSON.
summary() {
  python3 - "$1" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["conversation"]
turns = d["per_turn"]
p50 = lambda t: t["ttft_s"]["p50"] * 1e3
print(f"{sys.argv[2]:<34} wall {d['seconds']:6.1f} s  TTFT p50 turn1 {p50(turns[0]):7.1f} ms"
      f"  turn2 {p50(turns[1]):7.1f}  turn8 {p50(turns[-1]):7.1f}"
      f"  turns2+ {d['ttft_later_turns_s']['p50']*1e3:7.1f} ms  cached/prompt {sum(t['cached_tokens_mean'] for t in turns[1:]) / sum(t['prompt_tokens_mean'] for t in turns[1:]):.2f}")
PY
}

run_pdq() {  # run_pdq NAME WORKERS-JSON [fresh|-] [ROUTER-ARGS-JSON]
  log "pdq up ($1: $2 ${4:-}); pdq bench ${conv[*]}"
  up "$1" "$2" "${4:-[]}"
  "$bin/pdq" bench --router "$router" "${conv[@]}" --json "$work/$1.conv.json" >"$work/$1.out"
  summary "$work/$1.conv.json" "$1" | tee -a "$work/summary"
  if [ "${3:-}" = fresh ]; then
    log "pdq bench --input-tokens 128 --output-tokens 64 --concurrency $sessions --requests 16"
    "$bin/pdq" bench --router "$router" --input-tokens 128 --output-tokens 64 \
      --concurrency "$sessions" --requests 16 --json "$work/$1.fresh.json" >/dev/null
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f'{sys.argv[2]:<34} fresh 128-token prompt at concurrency $sessions: TTFT p50 {d[\"levels\"][0][\"ttft_s\"][\"p50\"]*1e3:.1f} ms')" \
      "$work/$1.fresh.json" "$1" | tee -a "$work/summary"
  fi
  down
}

run_llama() {
  log "llama-server -m $llama_model -t 2 -np $sessions -c 8192; pdq bench --openai ${conv[*]}"
  llama_up "$llama_server" "$llama_model" "$sessions" 8192
  "$bin/pdq" bench --openai "$llama_url" --model "$model" "${conv[@]}" \
    --json "$work/llama.conv.json" >"$work/llama.out2"
  summary "$work/llama.conv.json" "llama-server (Q4_0, prompt cache)" | tee -a "$work/summary"
  down
}

mono='[{"role": "both", "precision": "fp16", "threads": 2}]'
mono_off='[{"role": "both", "precision": "fp16", "threads": 2, "args": ["--prefix-cache", "off"]}]'
for r in $(seq "$rounds"); do
  run_pdq mono-fp16-cache-on "$mono" fresh
  [ -n "$llama_server" ] && run_llama
done
run_pdq mono-fp16-cache-off "$mono_off"
# pdq's precisions in one process: W8A8 prompts, W4A16 decode.
mixed='[{"role": "both", "prefill_precision": "w8a8", "precision": "w4a16", "threads": 2}]'
mixed_off='[{"role": "both", "prefill_precision": "w8a8", "precision": "w4a16", "threads": 2, "args": ["--prefix-cache", "off"]}]'
mixed_exact='[{"role": "both", "prefill_precision": "w8a8", "precision": "w4a16", "threads": 2, "args": ["--reuse-kv-any-precision=false"]}]'
run_pdq mono-w8a8-w4a16-cache-on "$mixed" fresh
# Exact reuse (only KV of the precision that would compute it): the W8A8
# prompt pass recomputes each previous answer the W4A16 decode wrote.
run_pdq mono-w8a8-w4a16-cache-on-exact "$mixed_exact"
run_pdq mono-w8a8-w4a16-cache-off "$mixed_off"
# W4A16 for both phases: the fastest one-process deployment on CPUs without
# VNNI, where W8A8 prompts run slower than W4A16's (bench/RESULTS.md).
w4='[{"role": "both", "precision": "w4a16", "threads": 2}]'
w4_off='[{"role": "both", "precision": "w4a16", "threads": 2, "args": ["--prefix-cache", "off"]}]'
run_pdq mono-w4a16-cache-on "$w4" fresh
run_pdq mono-w4a16-cache-off "$w4_off"
# 1P+1D as deploy/local/ starts it: both workers on every core, sharing them.
for pair in "fp16 fp16" "w8a8 w4a16"; do
  set -- $pair
  on="[{\"role\": \"prefill\", \"precision\": \"$1\"}, {\"role\": \"decode\", \"precision\": \"$2\"}]"
  off="${on//\"\}/\", \"args\": [\"--prefix-cache\", \"off\"]\}}"
  run_pdq "1p1d-$1-$2-cache-on" "$on" fresh
  # Every follow-up through the prefill worker (no short-suffix prefill on
  # the decode worker): what --local-prefill-tokens buys.
  [ "$1" = "$2" ] && run_pdq "1p1d-$1-$2-cache-on-local-0" "$on" - '["--local-prefill-tokens", "0"]'
  # Exact reuse: follow-ups go to the prefill worker, which recomputes the
  # previous answer (the decode worker's KV of it is W4A16's).
  [ "$1" != "$2" ] && run_pdq "1p1d-$1-$2-cache-on-exact" "${on//\"\}/\", \"args\": [\"--reuse-kv-any-precision=false\"]\}}"
  run_pdq "1p1d-$1-$2-cache-off" "$off"
done
# The same workers pinned to a core each (what deploy/local/ did before).
run_pdq 1p1d-w8a8-w4a16-pinned-cache-on '[{"role": "prefill", "precision": "w8a8", "threads": 1, "cpus": "0"},
  {"role": "decode", "precision": "w4a16", "threads": 1, "cpus": "1"}]'
echo
echo "## Summary ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores)"
cat "$work/summary"
