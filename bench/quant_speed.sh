#!/usr/bin/env bash
# The speed figures of bench/RESULTS.md's quantization section, in one go:
# each line runs a quantized precision and its baseline alternately in one
# process (bench-engine --baseline), so every ratio comes from one run.
# The explicit --fp16-layers/--w8-layers/--calib flags pin the configurations the table
# has always measured; the "default" lines measure what --precision alone
# gives now (quant/quantized_load.h).
# Usage: bench/quant_speed.sh [build dir]   (about 15 minutes on 2 cores)
set -euo pipefail
build="${1:-build}"
pdq="$build/bin/pdq"
run() {
  echo "+ $*" >&2
  "$@"
}
run "$build/bin/kernels_bench" --benchmark_min_time=0.3 \
  --benchmark_filter='W4A16|W8A8|F16/(1|512)/3072'
run "$pdq" bench-engine --precision w4a16 --group-size 128 --fp16-layers none --w8-layers none --baseline fp16 \
  --repetitions 3 --json
run "$pdq" bench-engine --precision w4a16 --group-size 32 --fp16-layers none --w8-layers none --baseline fp16 \
  --repetitions 3 --json
run "$pdq" bench-engine --precision w4a16 --baseline fp16 --repetitions 3 --json  # default
run "$pdq" bench-engine --precision w8a8 --calib none --fp16-layers none --w8-layers none --baseline fp16 \
  --repetitions 3 --json
run "$pdq" bench-engine --precision w8a8 --calib none --fp16-layers output,blk.*.down --w8-layers none \
  --baseline fp16 --repetitions 3 --json
run "$pdq" bench-engine --precision w8a8 --baseline fp16 --repetitions 3 --json  # default
run "$pdq" bench-engine --precision w4a16 --group-size 128 --fp16-layers none --w8-layers none --batch 32 \
  --gen-tokens 64 --baseline fp16 --repetitions 2 --json
