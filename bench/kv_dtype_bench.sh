#!/usr/bin/env bash
# What the KV cache's element type (--kv-dtype fp16 or bf16) does to decode
# speed, each figure a ratio measured in this run, fp16 and bf16 alternating
# within every round:
#  - `pdq bench-engine` (W4A16, 2 threads): 1 and 4 sequences decoding at
#    1,000 tokens of context each (the KV a conversation's later turns read),
#    and tg128 from an empty context (where the weights dominate);
#  - the conversation workload of bench/conversation_bench.sh (4 sessions,
#    8 turns, cache on) on monolithic W4A16, on one process prefilling at
#    W8A8 and decoding at W4A16, and on 1 W8A8 prefill + 1 W4A16 decode
#    worker sharing the cores (both workers at the same dtype: a pair that
#    differs is refused); then, on the same deployment, the TTFT of a fresh
#    prompt as long as a turn's new tokens (128) at the same concurrency, the
#    later turns' yardstick (issue 21);
#  - with LLAMA_SERVER and Q4_0_GGUF, llama.cpp's llama-server (built beside
#    pdq, outside the project; its prompt cache on) under the same client,
#    once per round.
# Usage: bench/kv_dtype_bench.sh BUILD [LLAMA_SERVER Q4_0_GGUF] [ROUNDS]
#        (about 6 minutes per round on 2 cores, 7 with llama-server)
set -euo pipefail
build="${1:-build}"
llama_server="${2:-}"
llama_model="${3:-}"
rounds="${4:-2}"
bin="$build/bin"
model="${PDQ_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
conv=(--workload conversation --sessions 4 --turns 8 --first-tokens 512 --turn-tokens 64
      --output-tokens 64)
work="$(mktemp -d /tmp/pdq-kv-dtype-bench-XXXXXX)"
source "$(dirname "$0")/lib.sh"

engine() {  # engine DTYPE BATCH CONTEXT
  log "pdq bench-engine --precision w4a16 --threads 2 --batch $2 --decode-context $3 --kv-dtype $1"
  "$bin/pdq" bench-engine --model "$model" --precision w4a16 --threads 2 --prompt-tokens 16 \
    --gen-tokens 128 --batch "$2" --decode-context "$3" --repetitions 1 --kv-dtype "$1" \
    --json >"$work/engine.json" 2>/dev/null
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f'engine {sys.argv[2]:<5} batch {sys.argv[3]:>2} context {sys.argv[4]:>4}: {d[\"decode_tokens_per_s\"]:7.1f} tokens/s')" \
    "$work/engine.json" "$1" "$2" "$3" | tee -a "$work/summary"
}

conversation() {  # conversation LABEL PDQ-BENCH-TARGET-ARGS...
  local label="$1"
  shift
  "$bin/pdq" bench "$@" "${conv[@]}" --json "$work/conv.json" >/dev/null
  python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['conversation']; print(f'conversation {sys.argv[2]:<32} all done {d[\"seconds\"]:6.1f} s  TTFT p50 turns 2+ {d[\"ttft_later_turns_s\"][\"p50\"]*1e3:6.1f} ms, turn 8 {d[\"per_turn\"][-1][\"ttft_s\"][\"p50\"]*1e3:6.1f} ms')" \
    "$work/conv.json" "$label" | tee -a "$work/summary"
}

pdq_conversation() {  # pdq_conversation LABEL WORKERS-JSON
  log "pdq up ($1: $2); pdq bench ${conv[*]}"
  up "$1" "$2"
  conversation "$1" --router "$router"
  log "pdq bench --input-tokens 128 --output-tokens 64 --concurrency 4 --requests 16"
  "$bin/pdq" bench --router "$router" --input-tokens 128 --output-tokens 64 --concurrency 4 \
    --requests 16 --json "$work/fresh.json" >/dev/null
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f'fresh 128-token prompt   {sys.argv[2]:<32} TTFT p50 {d[\"levels\"][0][\"ttft_s\"][\"p50\"]*1e3:6.1f} ms')" \
    "$work/fresh.json" "$1" | tee -a "$work/summary"
  down
}

for r in $(seq "$rounds"); do
  echo "## round $r" | tee -a "$work/summary"
  for dtype in fp16 bf16; do
    engine "$dtype" 1 1000
    engine "$dtype" 4 1000
    engine "$dtype" 1 0
  done
  for dtype in fp16 bf16; do
    kv="\"args\": [\"--kv-dtype\", \"$dtype\"]"
    pdq_conversation "mono-w4a16-$dtype" "[{\"role\": \"both\", \"precision\": \"w4a16\", \"threads\": 2, $kv}]"
    pdq_conversation "mono-w8a8-w4a16-$dtype" \
      "[{\"role\": \"both\", \"prefill_precision\": \"w8a8\", \"precision\": \"w4a16\", \"threads\": 2, $kv}]"
    pdq_conversation "1p1d-w8a8-w4a16-$dtype" \
      "[{\"role\": \"prefill\", \"precision\": \"w8a8\", $kv}, {\"role\": \"decode\", \"precision\": \"w4a16\", $kv}]"
  done
  if [ -n "$llama_server" ]; then
    log "llama-server -m $llama_model -t 2 -np 4 -c 8192; pdq bench --openai ${conv[*]}"
    llama_up "$llama_server" "$llama_model" 4 8192
    conversation "llama-server (Q4_0, prompt cache)" --openai "$llama_url" --model "$model"
    down
  fi
done
echo
echo "## Summary ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores)"
cat "$work/summary"
