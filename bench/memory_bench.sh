#!/usr/bin/env bash
# Worker memory against what it computes with (issue 22): for one worker of
# each precision (and the process that prefills at W8A8 and decodes at
# W4A16), its resident memory after start-up and after a short load, and its
# peak, against weights + KV blocks holding data + workspaces as the worker
# itself reports them on /metrics (pdq_weight_bytes, pdq_kv_used_peak_bytes,
# pdq_workspace_bytes). The bounds asked for: resident within 1.2x of that
# sum at steady state, peak within 1.5x.
# Usage: bench/memory_bench.sh [BUILD]   (about 2 minutes on 2 cores)
set -euo pipefail
build="${1:-build}"
bin="$build/bin"
model="${PDQ_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
work="$(mktemp -d /tmp/pdq-memory-bench-XXXXXX)"
source "$(dirname "$0")/lib.sh"

scrape() {  # scrape LABEL: one line from the worker's /metrics
  local metrics
  metrics="$(grep 'metrics at http://' "$work/up.out" | grep -v '^pdq up: router' | tail -1 |
    sed 's|.*metrics at http://||; s|/metrics||')"
  python3 - "$metrics" "$1" <<'PY'
import sys, urllib.request
body = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=10).read().decode()
m = {}
for line in body.splitlines():
    if line and not line.startswith("#"):
        name, _, value = line.rpartition(" ")
        m[name] = float(value)
mib = lambda b: b / 2**20
w, kv, ws = m["pdq_weight_bytes"], m["pdq_kv_used_peak_bytes"], m["pdq_workspace_bytes"]
rss, peak = m["process_resident_memory_bytes"], m["process_peak_resident_memory_bytes"]
base = w + kv + ws
print(f"{sys.argv[2]:<34} weights {mib(w):6.1f}  KV {mib(kv):5.1f}  workspace {mib(ws):5.1f} MiB"
      f"  | resident {mib(rss):6.1f} MiB = {rss/base:4.2f}x  peak {mib(peak):6.1f} MiB = {peak/base:4.2f}x")
PY
}

lscpu | grep -E '^Model name' >&2
for spec in "fp16|" "w8a8|" "w4a16|" "w4a16|\"--prefill-precision\", \"w8a8\""; do
  precision="${spec%%|*}" extra="${spec#*|}"
  name="$precision${extra:+ + w8a8 prefill}"
  log "pdq up (one worker, role both, $name, 1 thread)"
  up m "[{\"role\": \"both\", \"precision\": \"$precision\", \"threads\": 1, \"args\": [\"--skip-peaks\"${extra:+, $extra}]}]"
  sleep 1  # pdq up prints the metrics addresses just after it wrote its own
  scrape "$name, idle" | tee -a "$work/summary"
  "$bin/pdq" bench --router "$router" --input-tokens 512 --output-tokens 64 --concurrency 4 \
    --requests 8 >/dev/null 2>&1
  sleep 1
  scrape "$name, after 8 requests" | tee -a "$work/summary"
  down
done
echo
cat "$work/summary"
