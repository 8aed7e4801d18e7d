#!/usr/bin/env bash
# pdq's kernel paths against each other and against llama.cpp on this CPU, in
# one run with the two systems alternating (bench/RESULTS.md, "AVX-512 and
# AMX kernels"). llama.cpp is built beside pdq, outside the project, and its
# F16, Q8_0 and Q4_0 files are made from the same model with its own
# llama-quantize; none of its code enters pdq.
#
# Usage: bench/isa_speed.sh BUILD LLAMA_BIN LLAMA_MODELS [ROUNDS]
#   BUILD         pdq's build folder (build)
#   LLAMA_BIN     folder with llama-bench and llama-batched-bench
#   LLAMA_MODELS  folder with f16.gguf, q8_0.gguf and q4_0.gguf
#   ROUNDS        alternating rounds (default 3)
# Prints every raw line (kept in ISA_LOG, default a new file in $TMPDIR or
# /tmp), then each round's tables and the issue's targets as ratios within
# each round (bench/isa_speed_summary.py LOG redoes them from a saved log).
# About 5 minutes a round on a 2-core AMX Xeon (all four paths), less where
# the CPU has fewer. ISAS="amx" (PDQ_ISA names, space-separated) runs only
# those paths, so that pdq's and llama.cpp's runs of a round are about a
# minute apart (the issue's targets on the fastest path; the comparisons
# with AVX2 need avx2 in the list).
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
build="$1"
llama_bin="$2"
llama_models="$3"
rounds="${4:-3}"
pdq="$build/bin/pdq"
for f in "$pdq" "$llama_bin/llama-bench" "$llama_bin/llama-batched-bench" \
         "$llama_models/f16.gguf" "$llama_models/q8_0.gguf" "$llama_models/q4_0.gguf"; do
  [ -e "$f" ] || { echo "isa_speed: $f not found" >&2; exit 1; }
done
export LD_LIBRARY_PATH="$llama_bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The paths this CPU has, slowest first (PDQ_ISA names; amx only where the
# CPU has AMX, else it would run the avx512 path again).
isas=(avx2)
grep -q avx_vnni /proc/cpuinfo && isas+=(avxvnni)
grep -q avx512_vnni /proc/cpuinfo && isas+=(avx512)
grep -q amx_int8 /proc/cpuinfo && isas+=(amx)
if [ -n "${ISAS:-}" ]; then
  # The paths asked for, in the slowest-first order above (the last is the
  # fastest: the batch-invariant, W4A8 and old-layers runs take it).
  read -r -a wanted <<< "$ISAS"
  for isa in "${wanted[@]}"; do
    [[ " ${isas[*]} " == *" $isa "* ]] || { echo "isa_speed: this CPU has no $isa path (it has: ${isas[*]})" >&2; exit 1; }
  done
  kept=()
  for isa in "${isas[@]}"; do
    [[ " ${wanted[*]} " == *" $isa "* ]] && kept+=("$isa")
  done
  [ ${#kept[@]} -gt 0 ] || { echo "isa_speed: ISAS names no path" >&2; exit 1; }
  isas=("${kept[@]}")
fi

# Every raw line goes to the log too (a path that cannot be written fails
# here, not after the rounds); its tables and the targets' ratios
# (bench/isa_speed_summary.py) follow at the end.
log="${ISA_LOG:-$(mktemp "${TMPDIR:-/tmp}/isa_speed.XXXXXX")}"
: > "$log"

run() {
  echo "+ $*"
  "$@" 2>&1 | grep --line-buffered -v '^pdq: \|^llama_\|^load\|^print_info\|^main: \|^build_\|^common_\|^system_info' || true
}

all_rounds() {
  echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores;" \
    "flags: $(grep -o 'avx512[a-z_0-9]*\|amx_[a-z0-9]*\|avx_vnni' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  for round in $(seq 1 "$rounds"); do
    echo "== round $round"
    # Batch 1: prefill pp512 and decode tg128, each precision on each path;
    # on the fastest path also W4A16 as it was before the W8A16 output
    # projection and the bf16 tiles (FP16 output, int16/fp32 activations).
    for isa in "${isas[@]}"; do
      for precision in w8a8 w4a16 fp16; do
        run env PDQ_ISA="$isa" "$pdq" bench-engine --precision "$precision" --threads 2 \
          --prompt-tokens 512 --gen-tokens 128 --repetitions 2 --json
      done
    done
    run env PDQ_ISA="${isas[-1]}" "$pdq" bench-engine --precision w4a16 --threads 2 \
      --prompt-tokens 512 --gen-tokens 128 --repetitions 2 --fp16-output --bf16-rows 0 --json
    run "$llama_bin/llama-bench" -m "$llama_models/f16.gguf" -m "$llama_models/q8_0.gguf" \
      -m "$llama_models/q4_0.gguf" -t 2 -p 512 -n 128 -r 2 -o md
    # Batched decode: 32 sequences, each with 128 tokens of context, on each
    # path with the defaults (on AMX the bf16 tiles from 16 rows, elsewhere
    # int16 activations up to 64 rows); where there is AMX also with
    # --batch-invariant (int16 up to 64 rows: each row's logits its own
    # alone), and with W4A8 instead (int8 activations from 8 rows a step).
    for isa in "${isas[@]}"; do
      run env PDQ_ISA="$isa" "$pdq" bench-engine --precision w4a16 --threads 2 --batch 32 \
        --decode-context 128 --prompt-tokens 64 --gen-tokens 64 --repetitions 1 --json
    done
    if [ "${isas[-1]}" = amx ]; then
      run env PDQ_ISA=amx "$pdq" bench-engine --precision w4a16 --threads 2 --batch 32 \
        --decode-context 128 --prompt-tokens 64 --gen-tokens 64 --repetitions 1 --batch-invariant --json
    fi
    run env PDQ_ISA="${isas[-1]}" "$pdq" bench-engine --precision w4a16 --threads 2 --batch 32 \
      --decode-context 128 --prompt-tokens 64 --gen-tokens 64 --repetitions 1 --bf16-rows 0 \
      --w4a8-rows 8 --json
    run "$llama_bin/llama-batched-bench" -m "$llama_models/q4_0.gguf" -t 2 -c 8192 -b 2048 \
      -ub 512 -npp 128 -ntg 64 -npl 32
  done
}

all_rounds | tee "$log"
echo "== summary (raw lines in $log)"
python3 "$(dirname "$0")/isa_speed_summary.py" "$log"
