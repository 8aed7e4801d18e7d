#!/usr/bin/env bash
# The serving figures of bench/RESULTS.md ("Serving"), in one go, each a
# ratio measured in this run:
#  1. KV transfer throughput of each transport against memcpy of the same
#     spans (bench/kv_transfer_bench).
#  2. TTFT at concurrency 1 of 1 prefill + 1 decode worker against the
#     monolithic worker, same precision (FP16), 2048-token prompts; and the
#     part of the KV transfer not hidden behind the prefill, as a fraction of
#     TTFT (the prefill worker's pdq_kv_transfer_seconds: from the end of
#     compute to the decode worker's acknowledgement, against TTFT).
#  3. Decode tokens/s of the W4A16 decode worker with 32 streams through the
#     router, in steady state (its pdq_generated_tokens_total over 10 s while
#     all 32 decode), against `pdq bench-engine --batch 32` on the same
#     weights and threads.
# Usage: bench/serving_bench.sh [build dir] [sections, default "1 2 3"]
#        (about 10 minutes on 2 cores)
set -euo pipefail
build="${1:-build}"
sections="${2:-1 2 3}"
want() { [[ " $sections " == *" $1 "* ]]; }
bin="$build/bin"
work="$(mktemp -d /tmp/pdq-serving-bench-XXXXXX)"
up_pid=""
cleanup() {
  if [ -n "$up_pid" ]; then kill "$up_pid" 2>/dev/null || true; wait "$up_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

log() { echo "+ $*" >&2; }

# Starts `pdq up` on a config; sets router= and the metrics addresses.
up() {
  rm -f "$work/addr"
  "$bin/pdq" up --config "$1" --address-file "$work/addr" >"$work/up.out" 2>"$work/up.err" &
  up_pid=$!
  for _ in $(seq 600); do
    [ -s "$work/addr" ] && break
    kill -0 "$up_pid" 2>/dev/null || { cat "$work/up.err" >&2; exit 1; }
    sleep 0.5
  done
  router="$(cat "$work/addr")"
  metrics() { grep "^pdq up: $1.* metrics at" "$work/up.out" | sed 's|.*http://||; s|/metrics||'; }
}
down() {
  kill "$up_pid"
  wait "$up_pid" || true
  up_pid=""
}
# metric HOST:PORT SERIES -> its value
metric() {
  python3 - "$1" "$2" <<'EOF'
import sys, urllib.request
body = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=10).read().decode()
for line in body.splitlines():
    name, _, value = line.rpartition(" ")
    if name == sys.argv[2]:
        print(value)
        break
else:
    print("nan")
EOF
}
json_get() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }
config() {  # config FILE JSON-WORKERS
  printf '{"listen": "127.0.0.1:0", "kv_transport": "%s", "workers": %s}\n' "$transport" "$2" >"$1"
}

if want 1; then
  echo "## 1. KV transfer throughput against memcpy"
  log "$bin/kv_transfer_bench --tokens 512,2048,8192 --reps 5"
  "$bin/kv_transfer_bench" --tokens 512,2048,8192 --reps 5
fi

want 2 && for transport in tcp ucx; do
  echo
  echo "## 2. TTFT at concurrency 1, FP16, 2048-token prompts, KV over $transport"
  config "$work/mono.json" '[{"role": "both", "precision": "fp16", "threads": 2}]'
  config "$work/split.json" '[{"role": "prefill", "precision": "fp16", "threads": 2},
                              {"role": "decode", "precision": "fp16", "threads": 2}]'
  bench=(--concurrency 1 --input-tokens 2048 --output-tokens 4 --requests 6 --warmup 1)
  log "pdq up --config mono.json; pdq bench ${bench[*]}"
  up "$work/mono.json"
  "$bin/pdq" bench --router "$router" "${bench[@]}" --json "$work/mono.out.json"
  down
  log "pdq up --config split.json; pdq bench ${bench[*]}"
  up "$work/split.json"
  "$bin/pdq" bench --router "$router" "${bench[@]}" --json "$work/split.out.json"
  prefill_metrics="$(metrics 'worker 0')"
  tail_sum="$(metric "$prefill_metrics" pdq_kv_transfer_seconds_sum)"
  tail_count="$(metric "$prefill_metrics" pdq_kv_transfer_seconds_count)"
  compute_sum="$(metric "$prefill_metrics" pdq_prefill_seconds_sum)"
  down
  mono_ttft="$(json_get "$work/mono.out.json" "d['levels'][0]['ttft_s']['mean']")"
  split_ttft="$(json_get "$work/split.out.json" "d['levels'][0]['ttft_s']['mean']")"
  python3 - "$mono_ttft" "$split_ttft" "$tail_sum" "$tail_count" "$compute_sum" <<'EOF'
import sys
mono, split, tail_sum, n, compute_sum = map(float, sys.argv[1:])
tail, compute = tail_sum / n, compute_sum / n
print(f"TTFT mean: monolithic {mono*1e3:.1f} ms, 1P+1D {split*1e3:.1f} ms: ratio {split/mono:.3f}")
print(f"prefill compute {compute*1e3:.1f} ms; transfer after compute (not hidden) {tail*1e3:.2f} ms"
      f" = {tail/split*100:.2f}% of 1P+1D TTFT ({n:.0f} prompts incl. warm-up)")
EOF
done

want 3 || exit 0
echo
echo "## 3. Decode at 32 streams through the router against bench-engine --batch 32 (W4A16)"
transport=tcp
config "$work/decode.json" '[{"role": "prefill", "precision": "w8a8", "threads": 2},
                             {"role": "decode", "precision": "w4a16", "threads": 2}]'
log "pdq up --config decode.json; pdq bench --concurrency 32 --requests 32 --warmup 0 --input-tokens 128 --output-tokens 400"
up "$work/decode.json"
decode_metrics="$(metrics 'worker 1')"
"$bin/pdq" bench --router "$router" --concurrency 32 --requests 32 --warmup 0 \
  --input-tokens 128 --output-tokens 400 --json "$work/decode.out.json" >"$work/decode.out" &
bench_pid=$!
for _ in $(seq 1200); do
  [ "$(metric "$decode_metrics" pdq_active_sequences)" = "32" ] && break
  sleep 0.25
done
sleep 2
sample() {  # wall time, tokens, decode-step rows, decode-step seconds
  echo "$(date +%s.%N) $(metric "$decode_metrics" pdq_generated_tokens_total)" \
    "$(metric "$decode_metrics" pdq_decode_step_sequences_total)" \
    "$(metric "$decode_metrics" pdq_decode_step_seconds_sum)"
}
s0="$(sample)"
sleep 10
s1="$(sample)"
active="$(metric "$decode_metrics" pdq_active_sequences)"
wait "$bench_pid"
cat "$work/decode.out"
down
# The KV each sequence held in the window: the prompt plus half of what it
# had generated by the window's middle (32 streams started together).
context="$(python3 -c "import sys; a=sys.argv[1].split(); b=sys.argv[2].split(); print(int(128 + (float(a[1]) + float(b[1])) / 2 / 32))" "$s0" "$s1")"
log "pdq bench-engine --precision w4a16 --batch 32 --gen-tokens 64 --decode-context $context --threads 2 --json"
"$bin/pdq" bench-engine --precision w4a16 --batch 32 --gen-tokens 64 --decode-context "$context" \
  --threads 2 --json >"$work/engine.json"
engine_tps="$(json_get "$work/engine.json" "d['decode_tokens_per_s']")"
python3 - "$engine_tps" "$active" "$context" $s0 $s1 <<'EOF'
import sys
engine, active, context = map(float, sys.argv[1:4])
t0, n0, r0, d0, t1, n1, r1, d1 = map(float, sys.argv[4:])
served = (n1 - n0) / (t1 - t0)
inside = (r1 - r0) / (d1 - d0)
print(f"window: {t1 - t0:.1f} s, {active:.0f} of 32 streams still decoding at its end, "
      f"about {context:.0f} tokens of KV per sequence")
print(f"decode worker, 32 streams through the router: {served:.1f} tokens/s")
print(f"  its decode steps alone (rows / step seconds): {inside:.1f} tokens/s; "
      f"served / steps = {served / inside:.3f}")
print(f"bench-engine --batch 32 --decode-context {context:.0f}: {engine:.1f} tokens/s; "
      f"served / engine = {served / engine:.3f}")
EOF
