#!/usr/bin/env bash
# The GPU check, prepared so that the few minutes a GPU is lent go to
# measuring: every `gpu` test (each CUDA kernel against the CPU reference,
# the CUDA forward pass against the CPU engine), the kernel benchmark
# (gpu_bench) and the engine's speed on the GPU (`pdq bench-engine --device
# cuda`, W4A16 and W8A8 against FP16), writing their JSON.
#
# The lent GPU machines have the CUDA toolkit but none of the project's
# Debian libraries (Abseil, GoogleTest, gRPC), so the build happens on a
# development machine and travels:
#
#   scripts/gpu_check.sh bundle            # here: build into build-gpu/, copy the
#                                          # binaries and their libraries to .gpu/
#                                          # (and .gpu-model/, below)
#   scripts/gpu_check.sh run [OUTDIR]      # on the GPU machine, from the repo
#                                          # root, with .gpu/ carried along
#   scripts/gpu_check.sh run-model [OUTDIR]  # there too, with .gpu-model/ carried
#   scripts/gpu_check.sh all [OUTDIR]      # all three, on a GPU machine with
#                                          # the project's dependencies
#
# The default model (98 MB) is more than one call may carry, so .gpu-model/
# holds its first 4 blocks (scripts/truncate_gguf.py: real weights and
# tokenizer, 39 MB) with engine_cuda_test alone: `run-model` compares the
# GPU's greedy tokens with the CPU's on it. The two bundles (29 and 44 MB)
# need one device call each: `run` within 8 minutes, `run-model` within 2.
#
# `run` gives each test 30 seconds and starts none after 4 minutes, gives
# gpu_bench at most 3 more, and the engine benchmarks what is left of 7.8,
# so the whole check ends within 8.

set -euo pipefail

usage() {
  sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'
}

root=$(cd "$(dirname "$0")/.." && pwd)
bundle_dir=$root/.gpu
model_dir=$root/.gpu-model

# Copies every shared library the binaries in $1/bin load, except the C/C++
# runtime, the driver and cuBLAS (hundreds of MB; the GPU machine's CUDA
# toolkit has it), into $1/lib.
copy_libs() {
  mkdir -p "$1/lib"
  local deps lib
  deps=$(ldd "$1"/bin/*)
  if grep -q 'not found' <<<"$deps"; then
    grep 'not found' <<<"$deps" | sort -u >&2
    echo "gpu_check: a library the bundle needs is missing here" >&2
    exit 1
  fi
  while IFS= read -r lib; do
    case $(basename "$lib") in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
      libcuda.so*|libcublas*.so*) ;;
      *) cp -L "$lib" "$1/lib/" ;;
    esac
  done < <(awk '/=> \// {print $3}' <<<"$deps" | sort -u)
}

bundle() {
  local build=$root/build-gpu
  echo "== configuring $build (CUDA on, sm_90)"
  mkdir -p "$build"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPDQ_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >"$build/configure.log" 2>&1 ||
    { tail -20 "$build/configure.log"; echo "gpu_check: configure failed" >&2; exit 1; }
  echo "== building the GPU tests and benchmark"
  cmake --build "$build" --target cuda_kernels_test cuda_layout_test engine_cuda_test gpu_bench pdq
  rm -rf "$bundle_dir" "$model_dir"
  mkdir -p "$bundle_dir/bin"
  cp "$build/tests/cuda_kernels_test" "$build/tests/cuda_layout_test" \
    "$build/tests/engine_cuda_test" "$build/bin/gpu_bench" "$build/bin/pdq" "$bundle_dir/bin/"
  copy_libs "$bundle_dir"
  if [[ -f $root/models/SmolLM2-135M-Instruct.Q4_1.gguf ]]; then
    mkdir -p "$model_dir/bin"
    cp "$build/tests/engine_cuda_test" "$model_dir/bin/"
    copy_libs "$model_dir"
    python3 "$root/scripts/truncate_gguf.py" "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" \
      "$model_dir/smollm2-4-blocks.gguf" --layers 4
  else
    echo "== no models/SmolLM2-135M-Instruct.Q4_1.gguf (make model): no $model_dir"
  fi
  { git -C "$root" rev-parse HEAD
    [[ -z $(git -C "$root" status --porcelain --untracked-files=no) ]] || echo "with uncommitted changes"
  } 2>/dev/null | paste -sd' ' >"$bundle_dir/commit" || true
  [[ -d $model_dir ]] && cp "$bundle_dir/commit" "$model_dir/commit"
  echo "== bundled $(du -sh "$bundle_dir" | cut -f1) in $bundle_dir (commit $(cat "$bundle_dir/commit" 2>/dev/null))"
  [[ -d $model_dir ]] && echo "   and $(du -sh "$model_dir" | cut -f1) in $model_dir"
  echo "   on the GPU machine: scripts/gpu_check.sh run OUTDIR, with .gpu carried;"
  echo "   then scripts/gpu_check.sh run-model OUTDIR, with .gpu-model carried"
}

# Sets bundle_libs, the library path for bundle $1's binaries (its own
# libraries, then cuBLAS from the toolkit or else the pip wheel next to
# PyTorch), and says which commit the bundle holds. Only the bundle's
# binaries run with it (through `bundled`), not the machine's own tools.
use_bundle() {
  bundle_libs=$1/lib:/usr/local/cuda/lib64
  local py
  for py in /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu*/lib \
            /opt/torch/.venv/lib/python3*/site-packages/nvidia/cublas/lib; do
    if [[ -d $py ]]; then bundle_libs=$bundle_libs:$py; fi
  done
  echo "== bundle of commit $(cat "$1/commit" 2>/dev/null || echo unknown)"
}

bundled() {
  LD_LIBRARY_PATH=$bundle_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"
}

# A timeout of what is left until second $1 of the run, at least 1.
until_second() {
  local left=$(( $1 - SECONDS ))
  echo $(( left > 1 ? left : 1 ))
}

# Greedy tokens on the GPU against the CPU's, on the truncated real model.
run_model() {
  local out=${1:-$root/gpu-check-out}
  mkdir -p "$out"
  [[ -f $model_dir/smollm2-4-blocks.gguf ]] ||
    { echo "gpu_check: no $model_dir/smollm2-4-blocks.gguf (run 'scripts/gpu_check.sh bundle' with the model fetched)" >&2; exit 1; }
  use_bundle "$model_dir"
  local rc=0
  PDQ_MODEL=$model_dir/smollm2-4-blocks.gguf bundled timeout 120 "$model_dir/bin/engine_cuda_test" \
    --gtest_filter='EngineCudaRealModelTest.*' >"$out/model-test.log" 2>&1 || rc=$?
  tail -30 "$out/model-test.log"
  if [[ $rc != 0 ]] || grep -q '^\[  SKIPPED \]' "$out/model-test.log"; then
    echo "gpu_check: run-model FAILED"
    return 1
  fi
  echo "gpu_check: run-model PASSED"
}

run() {
  SECONDS=0
  local out=${1:-$root/gpu-check-out}
  mkdir -p "$out"
  [[ -x $bundle_dir/bin/gpu_bench ]] ||
    { echo "gpu_check: no bundle in $bundle_dir (run 'scripts/gpu_check.sh bundle' first)" >&2; exit 1; }
  use_bundle "$bundle_dir"
  if ! nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
      --format=csv,noheader 2>&1 | tee "$out/gpu.txt"; then
    echo "gpu_check: nvidia-smi found no GPU" >&2
  fi
  # Each test in its own process with its own time limit: a kernel fault
  # poisons its CUDA context, and must not take the other tests with it.
  # Everything goes into few files: the device tool returns at most 8.
  local failed=0 t name rc status skipped=0 names
  : >"$out/tests.log"
  : >"$out/tests-summary.txt"
  for t in cuda_layout_test cuda_kernels_test engine_cuda_test; do
    # The real-model test needs the model: run-model runs it.
    if ! names=$(bundled "$bundle_dir/bin/$t" --gtest_list_tests |
                 awk '/^[^ ]/ {suite = $1} /^  / {print suite $1}' |
                 grep -v '^EngineCudaRealModelTest\.') || [[ -z $names ]]; then
      echo "FAILED   $t: cannot list its tests (does it start here?)" | tee -a "$out/tests-summary.txt"
      failed=1
      continue
    fi
    for name in $names; do
      rc=0
      if (( SECONDS > 240 )); then
        echo "not started: the 4 minutes for tests are spent" >"$out/one.log"
        rc=125
      else
        bundled timeout 30 "$bundle_dir/bin/$t" --gtest_filter="$name" >"$out/one.log" 2>&1 || rc=$?
      fi
      if [[ $rc == 125 ]]; then
        status=NOTRUN
      elif [[ $rc == 124 ]]; then
        status=TIMEOUT
      elif [[ $rc != 0 ]]; then
        status=FAILED
      elif grep -q '^\[  SKIPPED \]' "$out/one.log"; then
        status=SKIPPED
        # A skip here means no GPU answered: the check has measured nothing.
        skipped=1
      else
        status=PASSED
      fi
      [[ $status == PASSED || $status == SKIPPED ]] || failed=1
      { echo "===== $name: $status"; cat "$out/one.log"; } >>"$out/tests.log"
      printf '%-8s %s\n' "$status" "$name" | tee -a "$out/tests-summary.txt"
    done
  done
  rm -f "$out/one.log"
  if [[ $skipped == 1 ]]; then
    echo "gpu_check: GPU tests skipped: no usable GPU here" >&2
    failed=1
  fi
  echo "== gpu_bench"
  if ! bundled timeout $(( SECONDS < 220 ? 180 : $(until_second 400) )) "$bundle_dir/bin/gpu_bench" \
      --json "$out/gpu_bench.json" 2>&1 | tee "$out/gpu_bench.log"; then
    failed=1
  fi
  # The engine on the GPU: decode at W4A16 and prefill at W8A8, each against
  # FP16 in the same process (synthetic Llama 3.2 1B shapes: no model file
  # travels). One JSON object per line.
  echo "== pdq bench-engine --device cuda"
  : >"$out/engine_bench.json"
  local args
  for args in "--precision w4a16 --baseline fp16" "--precision w8a8 --calib none --baseline fp16"; do
    if (( SECONDS > 430 )); then
      echo "not started (time): $args" | tee -a "$out/engine_bench.log"
      failed=1
      continue
    fi
    if ! bundled timeout "$(until_second 468)" "$bundle_dir/bin/pdq" bench-engine --model synthetic:llama-1b \
        $args --device cuda --prompt-tokens 512 --gen-tokens 64 --repetitions 3 --json \
        >>"$out/engine_bench.json" 2>>"$out/engine_bench.log"; then
      echo "failed: $args (see engine_bench.log)"
      failed=1
    fi
  done
  cat "$out/engine_bench.json"
  echo "== tests"
  cat "$out/tests-summary.txt"
  grep -h -B2 -A12 'Failure' "$out/tests.log" | head -60 || true
  echo "== results in $out"
  [[ $failed == 0 ]] && echo "gpu_check: PASSED" || echo "gpu_check: FAILED"
  return $failed
}

case ${1:-} in
  -h|--help) usage ;;
  bundle) bundle ;;
  run) shift; run "$@" ;;
  run-model) shift; run_model "$@" ;;
  all)
    shift
    bundle
    rc=0
    run "$@" || rc=1
    if [[ -d $model_dir ]]; then run_model "$@" || rc=1; fi
    exit $rc
    ;;
  *) usage >&2; exit 2 ;;
esac
