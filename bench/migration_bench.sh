#!/usr/bin/env bash
# Live migration (issue 27): the pause a stream sees when the router moves
# it, with its KV, to another decode worker, at 512 and 2048 tokens of
# context (p50, p99 of 20 moves each), against re-prefilling the same
# sequence (a fresh request for prompt + the tokens streamed before the
# move, nothing cached: what a move by recomputation costs at least). One
# prefill (W8A8) and two decode (W4A16) workers, one thread each, KV over
# TCP on loopback.
# Usage: bench/migration_bench.sh [BUILD] [ROUNDS]   (about 3 minutes on 2 cores)
set -euo pipefail
build="${1:-build}"
rounds="${2:-20}"
bin="$build/bin"
model="${PDQ_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
work="$(mktemp -d /tmp/pdq-migration-bench-XXXXXX)"
source "$(dirname "$0")/lib.sh"

log "host: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores"
up migration '[{"role": "prefill", "precision": "w8a8", "threads": 1},
  {"role": "decode", "precision": "w4a16", "threads": 1},
  {"role": "decode", "precision": "w4a16", "threads": 1}]'
log "$bin/migration_bench --router $router --context 512,2048 --rounds $rounds"
"$bin/migration_bench" --router "$router" --context 512,2048 --rounds "$rounds"
down
