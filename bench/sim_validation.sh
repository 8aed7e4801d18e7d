#!/usr/bin/env bash
# Issue 24's validation: what `pdq sim` predicts for a deployment against
# real runs of the same deployment on this machine. The predictions come
# from a profile of microbenchmarks only (`pdq profile`), never from the
# runs they are checked against, and are committed before those runs.
#
# Usage:
#   bench/sim_validation.sh predict BUILD DIR [NAMES]
#       pdq sim on DIR/profile.json (`pdq profile --thread-counts 1,2`) for
#       every configuration (or those of NAMES, comma-separated) and level,
#       goodput at the evaluation's targets for the workload (chat: TTFT
#       1.5 s, TPOT 50 ms) -> DIR/predicted/NAME-cLEVEL.json; SIM_FLAGS adds pdq sim flags
#       (e.g. --idle-passes, with PREDICTED=predicted-idle); PROFILE=FILE
#       predicts from another profile than DIR/profile.json (predict-open too)
#   bench/sim_validation.sh measure BUILD DIR [RUNS] [NAMES]
#       the real deployments (pdq up + pdq bench, closed loop), RUNS times
#       each (3), the configurations alternating within each round
#       -> DIR/measured/NAME-RUN.json; TRACK_SPEED=1: before each run,
#       speed_probe (as measure-open's, below) and that run's levels predicted
#       as predict does on the profile scaled by it, written before the run
#       starts -> DIR/predicted-tracked/NAME-RUN-cLEVEL.json (speed.txt: each
#       run's ratios; not for the A/B rollout)
#   bench/sim_validation.sh compare DIR
#       DIR/validation-PREDICTED.md: predicted against measured, each cell's error,
#       the run-to-run spread, the bias of each metric; TRACKED=1: each run
#       against its own tracked prediction -> DIR/validation-predicted-tracked.md
#   bench/sim_validation.sh predict-open BUILD DIR
#       open loop: each of OPEN_NAMES' capacity by pdq sim (16 clients back to
#       back), then Poisson rates at 50%, 70% and 85% of it, 20 requests after
#       2 unmeasured (5 seeds) -> DIR/predicted-open/ (rates.txt: the rates)
#       and each of the arrival seeds 1..OPEN_SEEDS (3) alone (NAME-sSEED.json);
#       OPEN_RATES=FILE takes an earlier set's rates.txt instead of the
#       capacity, OPEN_TAG=-NAME writes predicted-open-NAME
#   bench/sim_validation.sh measure-open BUILD DIR [RUNS] [NAME-fFRACTION,...]
#       the same rates against the real deployments, each rate on a deployment
#       of its own (pdq bench sends the same texts every run: a deployment
#       kept across rates would answer later ones from its prefix cache,
#       which the simulator does not model), run r sending the arrivals of
#       `pdq bench --arrival-seed r` -> DIR/measured-open/
#       TRACK_SPEED=1: before each run, speed_probe on the idle machine
#       against DIR/speed-reference.json, and that run's own arrivals
#       simulated on the profile scaled by how much slower the probe ran
#       (FP16 prompt passes by the FP16 prompts' ratio, other prompt passes
#       by the W8A8 prompts', decode by the W4A16 steps', on the CPU each
#       worker is pinned to, their mean where it floats; where one precision
#       serves both, the mean of its two; a reference without FP16 prompts,
#       before 2026-12-07 later, scales FP16 by W8A8's)
#       -> DIR/predicted-open-tracked/NAME-fF-sR.json, written before the
#       run starts (speed.txt: each run's ratios)
#   bench/sim_validation.sh speed-reference BUILD DIR
#       speed_probe right after the profile -> DIR/speed-reference.json: one-
#       thread W8A8 and FP16 prompts (128 tokens) and W4A16 decode steps (4
#       rows over 128 tokens) by pdq bench-engine, pinned to CPU 0 and to
#       CPU 1; the median of SPEED_REFERENCE_PROBES (3) probes (sets before
#       2026-12-07 took one)
#   bench/sim_validation.sh compare-open DIR
#       DIR/validation-open.md, as compare (p99 judged at 20%); MATCHED=1
#       sets each run beside its own arrivals simulated (run r sent
#       --arrival-seed r; runs before that flag sent seed 1's)
#   bench/sim_validation.sh predict-emulated BUILD DIR
#       the emulation tier: DIR/profile.json's passes times EMULATE_TIME_SCALE
#       (1) -> DIR/profile-emulated.json; for 8, 16 and 32 workers
#       (EMULATED_SIZES) of W8A8 prefill and W4A16 decode on one thread each,
#       128 prompt tokens and 128 out: the simulated capacity, then Poisson
#       rates at 50%, 70% and 85% of it, 150 requests after 10 unmeasured
#       (5 seeds) -> DIR/predicted-emulated/, and each of the arrival seeds
#       1..EMULATED_SEEDS (3) alone -> DIR/predicted-emulated/NAME-sSEED.json
#   bench/sim_validation.sh measure-emulated BUILD DIR [RUNS] [SIZE-fFRACTION,...]
#       the same deployments with every worker emulated (`--emulate`: the real
#       router, scheduler, KV transfers and gRPC, passes timed by the profile,
#       no compute), a deployment per rate, run r sending the arrivals of
#       `pdq bench --arrival-seed r` -> DIR/measured-emulated/
#   bench/sim_validation.sh compare-emulated DIR
#       DIR/validation-emulated.md, as compare-open, judged at 5% (the
#       issue's bound for the simulator against the emulation tier); with
#       MATCHED=1, each run against its own arrivals simulated
#       (validation-emulated-matched.md): the control plane's error without
#       the sampling error of 150 arrivals, which dominates p99
#   bench/sim_validation.sh compare-split BUILD DIR
#       the A/B rollout's closed-loop runs, each beside the seeds of pdq sim
#       that drew as its router did (requests per pool, from its workers'
#       /metrics; SPLIT_MATCH_SEEDS, 400, seeds each level) ->
#       DIR/validation-split-matched.md
#   bench/sim_validation.sh host-speed DIR
#       DIR/host-speed.md: for each real run (measured, measured-open), how
#       fast the host ran it against the profile: the workers' served prompt
#       passes and decode steps (their /metrics) over the profile's passes
#       timed alone for the same mean work, beside the run's TTFT and TPOT
#       p50 errors against its own arrivals simulated (open loop) or the
#       prediction (closed loop). A drifting host shows as errors that follow
#       the speed (the fit is not refitted: a diagnosis, not a correction);
#       where runs were measured with TRACK_SPEED=1, also the scale each
#       run's probe gave and its tracked prediction's errors
#   EMULATED_TAG=-NAME names another set of them (predicted-emulated-NAME,
#   measured-emulated-NAME, validation-emulated-NAME.md): a later model or
#   router, beside the earlier; EMULATED_RUNS_TAG=-OTHER compares them with
#   the runs of another set (the measured-emulated-OTHER of an earlier router),
#   and EMULATED_RATES_TAG=-OTHER predicts at that set's rates;
#   VALIDATION_SUFFIX=-NAME ends any compare's file name.
#
# Workload: chat (128 prompt tokens, 512 out), closed loop at concurrency
# 1, 4 and 8 (WORKLOAD=summarize: 2048 in, 32 out; analysis: 2048 in, 512
# out; both at 1 and 4), 2 requests per client plus one unmeasured request (pdq bench
# --warmup 1: the clients share 2c+1 requests and the first to finish is
# not counted). The simulator runs the same: every client starting at once,
# the same count of requests, the first to end not counted (pdq sim since
# 2026-12-07; before, the first sent, which with drawn router times need
# not be the one a step took alone and that ended first), exact lengths; the
# prediction is the mean of CLOSED_SEEDS (20) seeds, each drawing every
# request's time through the router (pdq sim --router-time exponential, its
# default since 2026-12-06: which of the requests sent at once share a step
# is a race the real runs decide one way or another; sets before it
# predicted with one seed of fixed router times), and for the A/B rollout,
# whose router draws each request's pool at random, of SPLIT_SEEDS (20).
# A configuration and run of chat takes about 1 minute on a 2-core Zen 4, 4
# on a Zen 1; summarize 1, analysis 1.5.
set -euo pipefail
cmd="${1:-}"
build="${2:-build}"
dir="${3:-}"
# Where predict writes and compare reads the predictions (PREDICTED=...).
predicted="${PREDICTED:-predicted}"
per_client=2
# WORKLOAD=chat (the default), summarize or analysis: the lengths of pdq
# bench's workload of that name and the closed-loop levels; predictions and
# runs of summarize and analysis are named NAME.WORKLOAD.
workload="${WORKLOAD:-chat}"
# Goodput's targets (ms) in the predictions: the evaluation's for the
# workload (deploy/eval/cpu-2core.json); predictions before 2026-12-07 night
# used pdq sim's defaults (2000, 200) and do not record them.
case $workload in
  chat) prompt_tokens=128 output_tokens=512 levels=(1 4 8) suffix="" targets=(1500 50) ;;
  summarize) prompt_tokens=2048 output_tokens=32 levels=(1 4) suffix=".summarize" targets=(15000 100) ;;
  analysis) prompt_tokens=2048 output_tokens=512 levels=(1 4) suffix=".analysis" targets=(15000 50) ;;
  *) echo "WORKLOAD=$workload: want chat, summarize or analysis" >&2; exit 2 ;;
esac

# Open loop (predict-open, measure-open): these configurations.
open_names="${OPEN_NAMES:-mono-w8a8-w4a16,1p1d-w8a8-w4a16}"
open_fractions=(0.5 0.7 0.85)
open_requests=20
open_warmup=2
open_seeds="${OPEN_SEEDS:-3}"  # arrival seeds predicted alone (runs 1..N send theirs)
open_tag="${OPEN_TAG:-}"       # predicted-openTAG, validation-openTAG.md

# The emulation tier (predict-emulated, measure-emulated): xP+yD of these sizes.
emulated_sizes="${EMULATED_SIZES:-3P+5D,6P+10D,12P+20D}"
emulate_time_scale="${EMULATE_TIME_SCALE:-1}"
emulated_prompt_tokens=128
emulated_output_tokens=128
emulated_requests=150
emulated_warmup=10
emulated_kv_tokens=4096
emulated_seeds="${EMULATED_SEEDS:-3}"  # arrival seeds predicted alone (runs 1..N send theirs)
tag="${EMULATED_TAG:-}"

# NAME|pdq up workers (JSON)|pdq sim flags
configs=(
  'mono-fp16|[{"role": "both", "precision": "fp16", "threads": 2}]|--deployment 1M --monolithic-precision fp16 --threads 2'
  'mono-w8a8-w4a16|[{"role": "both", "precision": "w4a16", "threads": 2, "args": ["--prefill-precision", "w8a8"]}]|--deployment 1M --monolithic-precision w4a16 --monolithic-prefill-precision w8a8 --threads 2'
  '1p1d-fp16|[{"role": "prefill", "precision": "fp16", "threads": 1, "cpus": "0"}, {"role": "decode", "precision": "fp16", "threads": 1, "cpus": "1"}]|--deployment 1P+1D --prefill-precision fp16 --decode-precision fp16 --threads 1'
  '1p1d-w8a8-w4a16|[{"role": "prefill", "precision": "w8a8", "threads": 1, "cpus": "0"}, {"role": "decode", "precision": "w4a16", "threads": 1, "cpus": "1"}]|--deployment 1P+1D --prefill-precision w8a8 --decode-precision w4a16 --threads 1'
  # The committed evaluation's other pairs.
  'mono-w4a16|[{"role": "both", "precision": "w4a16", "threads": 2}]|--deployment 1M --monolithic-precision w4a16 --threads 2'
  '1p1d-fp16-w4a16|[{"role": "prefill", "precision": "fp16", "threads": 1, "cpus": "0"}, {"role": "decode", "precision": "w4a16", "threads": 1, "cpus": "1"}]|--deployment 1P+1D --prefill-precision fp16 --decode-precision w4a16 --threads 1'
  # The A/B rollout: half the requests to an FP16 worker, half to a W8A8/W4A16
  # one, a core each (the router takes the --split of its pdq sim flags).
  'ab-fp16-vs-w8a8-w4a16|[{"role": "both", "precision": "fp16", "threads": 1, "cpus": "0", "pool": "fp16"}, {"role": "both", "precision": "w4a16", "threads": 1, "cpus": "1", "pool": "w8a8-w4a16", "args": ["--prefill-precision", "w8a8"]}]|--split fp16=50,w8a8-w4a16=50 --arms fp16=1M:fp16,w8a8-w4a16=1M:w8a8/w4a16 --threads 1'
  # The same rollout sticky per client: the router keeps each client id in
  # one pool (--split-sticky), pdq bench's clients send theirs
  # (--client-ids), and the simulator's clients land where their ids hash
  # to, so the runs and the prediction split alike (closed loop only).
  'ab-sticky-fp16-vs-w8a8-w4a16|[{"role": "both", "precision": "fp16", "threads": 1, "cpus": "0", "pool": "fp16"}, {"role": "both", "precision": "w4a16", "threads": 1, "cpus": "1", "pool": "w8a8-w4a16", "args": ["--prefill-precision", "w8a8"]}]|--split fp16=50,w8a8-w4a16=50 --split-sticky --client-ids --arms fp16=1M:fp16,w8a8-w4a16=1M:w8a8/w4a16 --threads 1'
)

# config_seeds FLAGS: the seeds a prediction of a configuration takes:
# CLOSED_SEEDS (20; each draws the requests' router times), and where the
# router draws each request's A/B pool, SPLIT_SEEDS (20) seeds' draws (not
# where each client's id decides its pool).
config_seeds() {
  if drawn_split "$1"; then echo "${SPLIT_SEEDS:-20}"; else echo "${CLOSED_SEEDS:-20}"; fi
}

# drawn_split FLAGS: whether the router draws each request's A/B pool at
# random (a split whose clients send no ids).
drawn_split() {
  [[ $1 == *--split* && $1 != *--client-ids* ]]
}

# up_config NAME WORKERS FLAGS: lib.sh's up, with the router's --split (and
# --split-sticky) where the configuration's pdq sim flags have them.
up_config() {
  if [[ $3 =~ --split\ ([^ ]+) ]]; then
    local sticky=""
    [[ $3 == *--split-sticky* ]] && sticky=', "--split-sticky"'
    up "$1" "$2" "[\"--split\", \"${BASH_REMATCH[1]}\"$sticky]"
  else
    up "$1" "$2"
  fi
}

# bench_flags FLAGS: what pdq bench adds for a configuration: --client-ids
# where its pdq sim flags have them.
bench_flags() {
  if [[ $1 == *--client-ids* ]]; then echo --client-ids; fi
}

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
if [[ $workload != chat && $cmd != predict && $cmd != measure && $cmd != compare ]]; then
  echo "WORKLOAD=$workload: only predict, measure and compare take another workload" >&2
  exit 2
fi
case $cmd in
  predict | measure | predict-open | measure-open | predict-emulated | measure-emulated | speed-reference | compare-split)
    [[ -n $dir ]] || usage
    [[ -x $build/bin/pdq ]] || { echo "no $build/bin/pdq (make build)" >&2; exit 1; } ;;
  compare | compare-open | compare-emulated | host-speed) dir="${2:-}"; [[ -d $dir ]] || usage ;;
  *) usage ;;
esac

# config_sim_flags PROFILE FLAGS: a configuration's pdq sim flags on PROFILE.
# A 1P+1D pair runs on one box, each worker pinned to a core: --co-located
# where the profile has the pair's split probe (pdq profile since 9ac8f70;
# earlier sets' profiles have none and predict as they did); CO_LOCATED=0
# never.
config_sim_flags() {
  local profile="$1" flags="$2"
  if [[ ${CO_LOCATED:-1} != 0 && $flags == *"--deployment 1P+1D"* &&
    $flags =~ --prefill-precision\ ([^ ]+)\ --decode-precision\ ([^ ]+) ]] &&
    python3 -c 'import json, sys
p = json.load(open(sys.argv[1]))
sys.exit(0 if any(s["prefill_precision"] == sys.argv[2] and s["decode_precision"] == sys.argv[3]
                  for s in p.get("splits", [])) else 1)' "$profile" "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"; then
    flags+=" --co-located"
  fi
  echo "$flags"
}

predict() {
  local profile="${PROFILE:-$dir/profile.json}"
  [[ -f $profile ]] || { echo "no $profile (pdq profile --thread-counts 1,2 --out ...)" >&2; exit 1; }
  mkdir -p "$dir/$predicted"
  local c name flags level only="${4:-}"
  for c in "${configs[@]}"; do
    IFS='|' read -r name _ flags <<<"$c"
    [[ -z $only || ",$only," == *",$name,"* ]] || continue
    flags="$(config_sim_flags "$profile" "$flags")"
    for level in "${levels[@]}"; do
      predict_level "$profile" "$flags" "$level" "$dir/$predicted/$name$suffix-c$level.json" |
        sed "s/^/$name$suffix c=$level: /"
    done
  done
}

# predict_level PROFILE FLAGS LEVEL OUT: pdq sim of a closed-loop level as
# the runs send it (CLOSED_SEEDS seeds, goodput at the workload's targets,
# SIM_FLAGS added and winning) -> OUT, its summary on stdout.
predict_level() {
  # shellcheck disable=SC2086  # flags are words
  "$build/bin/pdq" sim --profile "$1" $2 \
    --ttft-target-ms "${targets[0]}" --tpot-target-ms "${targets[1]}" ${SIM_FLAGS:-} \
    --prompt-tokens "$prompt_tokens" --output-tokens "$output_tokens" \
    --concurrency "$3" --requests $(($3 * per_client)) --warmup 1 \
    --seeds "$(config_seeds "$2")" --json "$4"
}

# lib.sh's pdq up helpers, and DIR/$1 for the runs; names the host.
start_measuring() {
  bin="$build/bin"
  # shellcheck disable=SC2034  # bin, model and work are lib.sh's
  model="${PDQ_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
  work="$(mktemp -d /tmp/pdq-sim-validation-XXXXXX)"
  # shellcheck source=bench/lib.sh
  source "$(dirname "$0")/lib.sh"
  mkdir -p "$dir/$1"
  lscpu | grep -E '^Model name' >&2
}

measure() {
  local runs="${4:-3}" only="${5:-}"
  start_measuring measured
  local r c name workers flags
  for r in $(seq "$runs"); do
    for c in "${configs[@]}"; do
      IFS='|' read -r name workers flags <<<"$c"
      [[ -z $only || ",$only," == *",$name,"* ]] || continue
      log "round $r: $name$suffix"
      if [[ ${TRACK_SPEED:-0} != 0 ]]; then
        if tracks_speed "$name"; then
          predict_tracked_closed "$name" "$r"
        else
          log "TRACK_SPEED=1: $name's A/B arms are not scaled; its run has no tracked prediction"
        fi
      fi
      up_config "$name" "$workers" "$flags"
      # shellcheck disable=SC2046  # bench_flags are words
      "$bin/pdq" bench --router "$router" --input-tokens "$prompt_tokens" \
        --output-tokens "$output_tokens" --concurrency "$(IFS=,; echo "${levels[*]}")" \
        --requests-per-client "$per_client" --warmup 1 $(bench_flags "$flags") \
        --json "$dir/measured/$name$suffix-$r.json" >"$work/bench.out" 2>&1 ||
        { cat "$work/bench.out" >&2; exit 1; }
      grep -E 'c=|concurrency' "$work/bench.out" | head -5 >&2 || true
      down
    done
  done
}

# predict_rate OUT SEEDS SIM-FLAGS...: pdq sim at one rate over five seeds
# -> OUT.json (its summary on stdout), and each run's own arrivals alone: run
# r sends those of `pdq bench --arrival-seed r`, which `pdq sim --seed r`
# draws too -> OUT-sR.json for r in 1..SEEDS (compare with MATCHED=1 sets
# each run beside its seed's).
predict_rate() {
  local out="$1" seeds="$2" s
  shift 2
  "$build/bin/pdq" sim "$@" --seeds 5 --json "$out.json"
  for s in $(seq "$seeds"); do
    "$build/bin/pdq" sim "$@" --seeds 1 --seed "$s" --json "$out-s$s.json" >/dev/null
  done
}

predict_open() {
  local profile="${PROFILE:-$dir/profile.json}"
  [[ -f $profile ]] || { echo "no $profile" >&2; exit 1; }
  local out="$dir/predicted-open$open_tag" c name flags f cap rate
  mkdir -p "$out"
  # OPEN_RATES=FILE: the rates of an earlier set's rates.txt (to predict runs
  # already made), not this model's capacity.
  if [[ -n ${OPEN_RATES:-} ]]; then
    cp "$OPEN_RATES" "$out/rates.new" && mv "$out/rates.new" "$out/rates.txt"
  else
    : >"$out/rates.txt"
  fi
  for c in "${configs[@]}"; do
    IFS='|' read -r name _ flags <<<"$c"
    [[ ",$open_names," == *",$name,"* ]] || continue
    flags="$(config_sim_flags "$profile" "$flags")"
    if [[ -z ${OPEN_RATES:-} ]]; then
      # shellcheck disable=SC2086  # flags are words
      "$build/bin/pdq" sim --profile "$profile" $flags --prompt-tokens "$prompt_tokens" \
        --output-tokens "$output_tokens" --concurrency 16 --requests 64 --warmup 16 \
        --seeds "$(config_seeds "$flags")" \
        --json "$out/$name-capacity.json" >/dev/null
      cap=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["output_tokens_per_second"]["mean"] / int(sys.argv[2]))' \
        "$out/$name-capacity.json" "$output_tokens")
      for f in "${open_fractions[@]}"; do
        echo "$name $f $(python3 -c "print(f'{$cap * $f:.3g}')")" >>"$out/rates.txt"
      done
    fi
    while read -r _ f rate; do
      # shellcheck disable=SC2086
      predict_rate "$out/$name-f$f" "$open_seeds" --profile "$profile" $flags \
        --prompt-tokens "$prompt_tokens" --output-tokens "$output_tokens" --rate "$rate" \
        --requests "$open_requests" --warmup "$open_warmup" | sed "s/^/$name $rate\/s: /"
    done < <(grep "^$name " "$out/rates.txt")
  done
}

measure_open() {
  local runs="${4:-1}" only="${5:-}"
  start_measuring measured-open
  local r c name workers flags f rate
  for r in $(seq "$runs"); do
    for c in "${configs[@]}"; do
      IFS='|' read -r name workers flags <<<"$c"
      while read -r _ f rate; do
        [[ -z $only || ",$only," == *",$name-f$f,"* ]] || continue
        log "round $r: $name at $rate/s"
        [[ ${TRACK_SPEED:-0} == 0 ]] || predict_tracked "$name" "$f" "$rate" "$r"
        up_config "$name" "$workers" "$flags"
        "$bin/pdq" bench --router "$router" --input-tokens "$prompt_tokens" \
          --output-tokens "$output_tokens" --rate "$rate" --requests "$open_requests" \
          --arrival-seed "$r" --warmup "$open_warmup" --json "$dir/measured-open/$name-f$f-$r.json" >"$work/bench.out" 2>&1 ||
          { cat "$work/bench.out" >&2; exit 1; }
        down
      done < <(grep "^$name " "$dir/predicted-open$open_tag/rates.txt")
    done
  done
}

compare_open() { OPEN=1 compare; }

# speed_probe OUT: the host's speed now, on each CPU the 1P+1D
# configurations pin a worker to -> OUT (JSON: per CPU, W8A8 prompt, FP16
# prompt and W4A16 decode tokens/s at one thread, each the mean of 10
# repetitions; sets before 2026-12-06 night took 5, sets before 2026-12-07
# later timed no FP16 prompts: on Zen 3 they drifted apart from W8A8's).
speed_probe() {
  python3 - "$build/bin/pdq" "$1" <<'PY'
import json, subprocess, sys
pdq, out = sys.argv[1], sys.argv[2]
def run(cpu, args, key):
    r = subprocess.run(["taskset", "-c", str(cpu), pdq, "bench-engine", "--threads", "1",
                        "--repetitions", "10", "--json", *args],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)[key]
probe = {}
for cpu in (0, 1):
    probe[f"cpu{cpu}"] = {
        "prompt_tokens_per_s": run(cpu, ["--precision", "w8a8", "--prompt-tokens", "128",
                                         "--gen-tokens", "4"], "prefill_tokens_per_s"),
        "fp16_prompt_tokens_per_s": run(cpu, ["--precision", "fp16", "--prompt-tokens", "128",
                                              "--gen-tokens", "4"], "prefill_tokens_per_s"),
        "decode_tokens_per_s": run(cpu, ["--precision", "w4a16", "--prompt-tokens", "16",
                                         "--batch", "4", "--decode-context", "128",
                                         "--gen-tokens", "32"], "decode_tokens_per_s")}
json.dump(probe, open(out, "w"), indent=1)
PY
}

# speed_reference: SPEED_REFERENCE_PROBES (3) speed probes in a row, each
# figure their median -> DIR/speed-reference.json (the probes themselves:
# speed-reference-probes.json). This guest's one-thread W8A8 prompts moved
# 1.0-2.1 thousand tokens/s between probes a minute apart (2026-12-06): one
# probe would set every tracked prediction by one moment's speed.
speed_reference() {
  [[ -f $dir/profile.json ]] || { echo "no $dir/profile.json: profile first" >&2; exit 1; }
  local i n="${SPEED_REFERENCE_PROBES:-3}"
  for i in $(seq "$n"); do
    speed_probe "$dir/speed-reference-$i.json"
  done
  python3 - "$dir" "$n" <<'PY'
import json, statistics, sys
d, n = sys.argv[1], int(sys.argv[2])
probes = [json.load(open(f"{d}/speed-reference-{i}.json")) for i in range(1, n + 1)]
ref = {cpu: {k: statistics.median(p[cpu][k] for p in probes) for k in probes[0][cpu]} for cpu in probes[0]}
json.dump(ref, open(f"{d}/speed-reference.json", "w"), indent=1)
json.dump(probes, open(f"{d}/speed-reference-probes.json", "w"), indent=1)
PY
  rm -f "$dir"/speed-reference-[0-9]*.json
  cat "$dir/speed-reference.json"
}

# tracked_profile NAME LABEL OUT: speed_probe now, and DIR/profile.json's
# passes scaled by how much slower than DIR/speed-reference.json it ran, for
# configuration NAME's precisions -> $work/profile-tracked.json (LABEL and
# the ratios appended to OUT/speed.txt); prints NAME's pdq sim flags on it.
tracked_profile() {
  local name="$1" label="$2" out="$3" c flags
  [[ -f $dir/speed-reference.json ]] || { echo "no $dir/speed-reference.json (speed-reference)" >&2; exit 1; }
  mkdir -p "$out"
  for c in "${configs[@]}"; do
    [[ ${c%%|*} == "$name" ]] && flags="${c##*|}"
  done
  # Called as $(tracked_profile ...), where set -e does not reach: each
  # step exits on failure itself.
  rm -f "$work/speed-now.json"
  speed_probe "$work/speed-now.json" || exit 1
  python3 - "${PROFILE:-$dir/profile.json}" "$dir/speed-reference.json" "$work/speed-now.json" "$flags" \
    "$label" >"$work/profile-tracked.json" 2>"$work/speed-line.txt" <<'PY' || { cat "$work/speed-line.txt" >&2; exit 1; }
import json, re, statistics, sys
profile, ref, now = (json.load(open(f)) for f in sys.argv[1:4])
flags, label = sys.argv[4], sys.argv[5]
def flag(name):
    m = re.search(rf"--{name} (\S+)", flags)
    return m.group(1) if m else None
# How much longer a pass takes now than at the reference, per CPU and kind
# (references before 2026-12-07 later have no FP16 prompts: W8A8's stand in).
slow = {cpu: {k: ref[cpu][k] / now[cpu][k] for k in ref[cpu]} for cpu in ref}
def prompt_slow(precision, cpus):
    key = "fp16_prompt_tokens_per_s" if precision == "fp16" else "prompt_tokens_per_s"
    return statistics.fmean(slow[c].get(key, slow[c]["prompt_tokens_per_s"]) for c in cpus)
if "--deployment 1M" in flags:  # its threads float over both CPUs
    prompt = flag("monolithic-prefill-precision") or flag("monolithic-precision")
    decode, p_slow = flag("monolithic-precision"), prompt_slow(prompt, slow)
    d_slow = statistics.fmean(slow[c]["decode_tokens_per_s"] for c in slow)
else:  # pinned as configs pins them: the prefill worker on CPU 0, the decode worker on CPU 1
    prompt, decode = flag("prefill-precision"), flag("decode-precision")
    p_slow, d_slow = prompt_slow(prompt, ["cpu0"]), slow["cpu1"]["decode_tokens_per_s"]
scale = ({prompt: (p_slow + d_slow) / 2} if prompt == decode else {prompt: p_slow, decode: d_slow})
for p in profile["passes"]:
    s = scale.get(p["precision"])
    if s is None:
        continue
    for k in ("fixed", "per_row", "per_token", "per_pair", "per_decode_pair", "step_overhead",
              "step_overhead_per_row", "stream_finish_seconds"):
        if k in p:
            p[k] *= s
    p["row_steps"] = [[rows, seconds * s] for rows, seconds in p.get("row_steps", [])]
for s_ in profile.get("splits", []):
    for k in ("decode_step_overhead", "decode_step_overhead_per_row"):
        s_[k] *= scale.get(s_["decode_precision"], 1)
print(json.dumps(profile))
print(f"{label}: " + ", ".join(f"{k} x{v:.3f}" for k, v in scale.items()) + " (probe: " +
      "; ".join(f"{c} prompts x{slow[c]['prompt_tokens_per_s']:.3f}"
                + (f", fp16 prompts x{slow[c]['fp16_prompt_tokens_per_s']:.3f}"
                   if "fp16_prompt_tokens_per_s" in slow[c] else "")
                + f", decode x{slow[c]['decode_tokens_per_s']:.3f}" for c in slow) + ")", file=sys.stderr)
PY
  cat "$work/speed-line.txt" >>"$out/speed.txt"
  cat "$work/speed-line.txt" >&2
  config_sim_flags "$work/profile-tracked.json" "$flags"
}

# tracks_speed NAME: whether TRACK_SPEED=1 can scale NAME's passes (one
# precision pair: the A/B rollout's arms are in --arms, which it does not
# rewrite).
tracks_speed() {
  local c
  for c in "${configs[@]}"; do
    [[ ${c%%|*} == "$1" && $c == *--split* ]] && return 1
  done
  return 0
}

# predict_tracked NAME FRACTION RATE RUN: tracked_profile, and run RUN's
# arrivals simulated on it (measure-open with TRACK_SPEED=1).
predict_tracked() {
  local name="$1" f="$2" rate="$3" r="$4" flags out="$dir/predicted-open-tracked"
  if ! tracks_speed "$name"; then
    echo "TRACK_SPEED=1 scales one pair's passes; the A/B rollout's are in --arms: measure $name without it" >&2
    exit 1
  fi
  flags="$(tracked_profile "$name" "$name-f$f run $r" "$out")"
  # shellcheck disable=SC2086  # flags are words
  "$build/bin/pdq" sim --profile "$work/profile-tracked.json" $flags \
    --prompt-tokens "$prompt_tokens" --output-tokens "$output_tokens" --rate "$rate" \
    --requests "$open_requests" --warmup "$open_warmup" --seeds 1 --seed "$r" \
    --json "$out/$name-f$f-s$r.json" >/dev/null
}

# predict_tracked_closed NAME RUN: tracked_profile, and the closed-loop
# levels predicted on it as predict does (CLOSED_SEEDS seeds) ->
# DIR/predicted-tracked/NAME-RUN-cLEVEL.json (measure with TRACK_SPEED=1).
predict_tracked_closed() {
  local name="$1" r="$2" flags level out="$dir/predicted-tracked"
  flags="$(tracked_profile "$name" "$name$suffix run $r" "$out")"
  for level in "${levels[@]}"; do
    predict_level "$work/profile-tracked.json" "$flags" "$level" \
      "$out/$name$suffix-$r-c$level.json" >/dev/null
  done
}

# pdq sim's flags for an emulated deployment SIZE ("3P+5D").
emulated_sim_flags() {
  echo "--deployment $1 --prefill-precision w8a8 --decode-precision w4a16 --threads 1" \
    "--kv-blocks $((emulated_kv_tokens / 16)) --prompt-tokens $emulated_prompt_tokens" \
    "--output-tokens $emulated_output_tokens"
}

predict_emulated() {
  [[ -f $dir/profile.json ]] || { echo "no $dir/profile.json" >&2; exit 1; }
  local out="$dir/predicted-emulated$tag" size f cap rate
  mkdir -p "$out"
  # The passes the emulated workers take: the profile's, scaled.
  python3 - "$dir/profile.json" "$emulate_time_scale" >"$dir/profile-emulated.json" <<'PY'
import json, os, sys
p = json.load(open(sys.argv[1]))
k = float(sys.argv[2])
for q in p["passes"]:
    for f in ("fixed", "per_row", "per_token", "per_pair", "per_decode_pair"):
        if f in q:
            q[f] *= k
    for step in q.get("row_steps", []):
        step[1] *= k
    q.pop("samples", None)
    # Emulated workers take their passes' time exactly, not served ones; but
    # their stepping loop is the real one (it samples the emulated logits and
    # sends the tokens, and ends streams), so the loop time the profile
    # measured beside the passes stays, unscaled (EMULATED_LOOP=0 drops it,
    # as sets before 2026-12-06 did).
    drop = ["served_factor", "served_pair_factor", "served", "served_prompt_factor",
            "served_prompts", "served_row_factors"]
    if os.environ.get("EMULATED_LOOP", "1") == "0":
        drop += ["step_overhead", "step_overhead_per_row", "stream_finish_seconds"]
    for f in drop:
        q.pop(f, None)
json.dump(p, sys.stdout, indent=1)
PY
  echo "time scale $emulate_time_scale" >"$out/rates.txt"
  # EMULATED_RATES_TAG=-OTHER: the rates of predicted-emulated-OTHER (to
  # predict runs already made), not this model's capacity.
  if [[ -n ${EMULATED_RATES_TAG+x} ]]; then
    grep -v '^time ' "$dir/predicted-emulated$EMULATED_RATES_TAG/rates.txt" >>"$out/rates.txt"
  else
    predict_emulated_rates "$out"
  fi
  while read -r size f rate; do
    [[ $size == time ]] && continue
    # shellcheck disable=SC2046
    predict_rate "$out/$size-f$f" "$emulated_seeds" --profile "$dir/profile-emulated.json" \
      $(emulated_sim_flags "$size") --rate "$rate" --requests "$emulated_requests" \
      --warmup "$emulated_warmup" | sed "s/^/$size $rate\/s: /"
  done <"$out/rates.txt"
}

# Each size's simulated capacity, and the rates at open_fractions of it ->
# OUT/rates.txt.
predict_emulated_rates() {
  local out="$1" size workers c cap f
  for size in ${emulated_sizes//,/ }; do
    # Capacity: 8 clients a worker back to back (enough to saturate its
    # busiest pool), what they finish a second once warm.
    workers=$(( $(sed -E 's/([0-9]+)P\+([0-9]+)D/\1 + \2/' <<<"$size") ))
    c=$((8 * workers))
    # shellcheck disable=SC2046  # flags are words
    "$build/bin/pdq" sim --profile "$dir/profile-emulated.json" $(emulated_sim_flags "$size") \
      --concurrency "$c" --requests $((4 * c)) --warmup "$c" --seeds 1 \
      --json "$out/$size-capacity.json" | grep bound | sed "s/^/$size capacity: /"
    cap=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["output_tokens_per_second"]["mean"] / int(sys.argv[2]))' \
      "$out/$size-capacity.json" "$emulated_output_tokens")
    for f in "${open_fractions[@]}"; do
      echo "$size $f $(python3 -c "print(f'{$cap * $f:.3g}')")" >>"$out/rates.txt"
    done
  done
}

# pdq up's workers for an emulated SIZE, every one on --emulate PROFILE.
emulated_workers() {
  python3 - "$1" "$2" "$emulate_time_scale" "$emulated_kv_tokens" <<'PY'
import json, re, sys
p, d = map(int, re.fullmatch(r"(\d+)P\+(\d+)D", sys.argv[1]).groups())
# The workers' KV cache of the element type the profile ran on (they refuse another).
kv_dtype = json.load(open(sys.argv[2]))["model"].get("kv_dtype", "fp16")
args = ["--emulate", sys.argv[2], "--emulate-load-seconds", "0", "--emulate-time-scale", sys.argv[3],
        "--kv-tokens", sys.argv[4], "--kv-dtype", kv_dtype]
w = [{"role": "prefill", "precision": "w8a8", "threads": 1, "args": args}] * p
w += [{"role": "decode", "precision": "w4a16", "threads": 1, "args": args}] * d
print(json.dumps(w))
PY
}

measure_emulated() {
  local runs="${4:-1}" only="${5:-}"
  start_measuring "measured-emulated$tag"
  local r size f rate profile
  profile="$(realpath "$dir/profile.json")"
  for r in $(seq "$runs"); do
    while read -r size f rate; do
      [[ $size == time ]] && continue
      [[ -z $only || ",$only," == *",$size-f$f,"* ]] || continue
      log "round $r: $size emulated at $rate/s"
      up "$size" "$(emulated_workers "$size" "$profile")"
      local before after
      before="$(head -1 /proc/stat)"
      "$bin/pdq" bench --router "$router" --input-tokens "$emulated_prompt_tokens" \
        --output-tokens "$emulated_output_tokens" --rate "$rate" --requests "$emulated_requests" \
        --arrival-seed "$r" --warmup "$emulated_warmup" --json "$dir/measured-emulated$tag/$size-f$f-$r.json" >"$work/bench.out" 2>&1 ||
        { cat "$work/bench.out" >&2; exit 1; }
      after="$(head -1 /proc/stat)"
      # What the emulation itself (router, workers, client) kept the cores
      # busy: it must stay well under them, or it measures the machine.
      python3 -c 'import sys
a, b = ([int(x) for x in s.split()[1:]] for s in sys.argv[1:3])
d = [y - x for x, y in zip(a, b)]
print(f"cores busy: {1 - (d[3] + d[4]) / sum(d):.0%}")' "$before" "$after" |
        tee "$dir/measured-emulated$tag/$size-f$f-$r.cpu" >&2
      down
    done <"$dir/predicted-emulated$tag/rates.txt"
  done
}

compare_emulated() { OPEN=1 EMULATED=1 compare; }

compare() {
  python3 - "$dir" <<'PY'
import glob, json, os, re, statistics, sys
d = sys.argv[1]
open_loop = os.environ.get("OPEN") == "1"
metrics = [("ttft", "p50"), ("ttft", "p90"), ("tpot", "p50"), ("tpot", "p90"), ("out", "")]
if open_loop:  # output tokens/s follows the arrival rate there; p99 is judged instead
    metrics = [("ttft", "p50"), ("ttft", "p90"), ("ttft", "p99"), ("tpot", "p50"), ("tpot", "p90"), ("tpot", "p99")]
def measured_cell(level, m, q):
    if m == "out":
        return level["output_tokens_per_s"]
    return level[f"{m}_s"][q] * 1e3
def predicted_cell(p, m, q):
    if m == "out":
        return p["output_tokens_per_second"]["mean"]
    return p[f"{m}_{q}"]["mean"] * 1e3
rows, errors = [], {f"{m} {q}".strip(): [] for m, q in metrics}
emulated = os.environ.get("EMULATED") == "1"
matched = os.environ.get("MATCHED") == "1"
# TRACKED=1 (closed loop): each run beside the prediction measure wrote just
# before it with TRACK_SPEED=1 (predicted-tracked/NAME-RUN-cLEVEL.json).
tracked = not open_loop and os.environ.get("TRACKED") == "1"
matched = matched or tracked
tag = os.environ.get("EMULATED_TAG", "")
runs_tag = os.environ.get("EMULATED_RUNS_TAG", tag)
measured = f"measured-emulated{runs_tag}" if emulated else "measured-open" if open_loop else "measured"
open_tag = os.environ.get("OPEN_TAG", "")
predicted = (f"predicted-emulated{tag}" if emulated else f"predicted-open{open_tag}" if open_loop
             else "predicted-tracked" if tracked else os.environ.get("PREDICTED", "predicted"))
# The simulator against the emulation tier: 5% (the issue's bound), p99 10%.
base_bound = 0.05 if emulated else 0.10
names = sorted({re.sub(r"-\d+\.json$", "", os.path.basename(f))
                for f in glob.glob(f"{d}/{measured}/*.json")})
for name in names:
    # NAME-RUN.json exactly: NAME-* would also take another name's runs
    # (1p1d-fp16-* those of 1p1d-fp16-w4a16).
    files = [f for f in sorted(glob.glob(f"{d}/{measured}/{name}-*.json"))
             if re.fullmatch(re.escape(name) + r"-\d+\.json", os.path.basename(f))]
    runs = [json.load(open(f)) for f in files]
    run_ids = [re.search(r"-(\d+)\.json$", f).group(1) for f in files]
    for level in runs[0]["levels"]:
        c = level["concurrency"]
        # Open loop: NAME is DEPLOYMENT-fFRACTION, one level (concurrency 0).
        pf = f"{d}/{predicted}/{name}.json" if open_loop else f"{d}/{predicted}/{name}-c{c}.json"
        # MATCHED=1: each run beside the prediction of its own arrivals
        # (NAME-sSEED.json; runs before --arrival-seed sent seed 1's).
        same = [f"{d}/{predicted}/{name}-s{r.get('arrival_seed', 1)}.json" for r in runs]
        if tracked:  # TRACKED=1: each run beside its prediction on its own probe's speed
            same = [f"{d}/{predicted}/{name}-{i}-c{c}.json" for i in run_ids]
            pf = same[0]
        if matched and not all(os.path.exists(f) for f in same):
            if tracked:
                print(f"{name} at {c} clients: a run without its tracked prediction "
                      "(measured without TRACK_SPEED=1): left out", file=sys.stderr)
            continue
        if not os.path.exists(pf):
            if not matched:
                continue
            pf = same[0]  # runs predicted one by one (TRACK_SPEED=1): no five-seed file
        p = json.load(open(pf))
        own = [json.load(open(f)) for f in same] if matched else []
        cells = []
        for m, q in metrics:
            vals = [measured_cell(next(l for l in r["levels"] if l["concurrency"] == c), m, q)
                    for r in runs]
            mean = statistics.fmean(vals)
            spread = max(abs(v - mean) for v in vals) / mean if mean else 0
            pred = (statistics.fmean(predicted_cell(x, m, q) for x in own)
                    if matched else predicted_cell(p, m, q))
            err = pred / mean - 1 if mean else float("nan")
            bound = base_bound if m == "out" else max(2 * base_bound if q == "p99" else base_bound, 2 * spread)
            errors[f"{m} {q}".strip()].append((err, abs(err) <= bound))
            cells.append(f"{pred:.0f} / {mean:.0f} ({err:+.1%}, ±{spread:.1%}){'' if abs(err) <= bound else ' **'}")
        load = f"{p['rate']:.3g}/s" if open_loop else str(c)
        rows.append(f"| {name} | {load} | {len(runs)} | " + " | ".join(cells) + " |")
heads = [f"{m.upper()} {q} (ms)" if m != "out" else "output tokens/s" for m, q in metrics]
out = [
    f"| deployment | {'rate' if open_loop else 'clients'} | runs | " + " | ".join(heads) + " |",
    "| --- | ---: | ---: |" + " --- |" * len(metrics),
    *rows, "",
    *(["Predicted: the mean of each run's own prediction, written just before it on the profile scaled",
       "by the speed probe run then (TRACK_SPEED=1; predicted-tracked/speed.txt)."] if tracked else
      ["Predicted: the mean of each run's own arrivals simulated (pdq sim --seed = the run's",
       "--arrival-seed), not of five seeds."] if matched else []),
    "Each cell: predicted / measured mean of the runs (the prediction's error, the runs' spread: their",
    "largest distance from their mean). ** : outside the bound (the larger of "
    f"{base_bound:.0%} (p99: {2 * base_bound:.0%}) and twice",
    f"the spread; throughput {base_bound:.0%}).", "",
    "| metric | bias (mean error) | median absolute error | largest absolute error | cells within the bound |",
    "| --- | ---: | ---: | ---: | ---: |",
]
for k, cells in errors.items():
    if not cells:
        continue
    es = [e for e, _ in cells]
    out.append(f"| {k} | {statistics.fmean(es):+.1%} | {statistics.median(abs(e) for e in es):.1%} | "
               f"{max(abs(e) for e in es):.1%} | {sum(ok for _, ok in cells)} of {len(cells)} |")
open(f"{d}/validation-{'emulated' + tag if emulated else 'open' + open_tag if open_loop else predicted}"
     f"{'-matched' if matched and not tracked else ''}{os.environ.get('VALIDATION_SUFFIX', '')}.md", "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
}

# compare_split: the A/B rollout's closed-loop runs against the simulator
# given each run's own draws. The router draws each request's pool at random
# (pdq bench sends no client id), so with 3 to 17 requests a level the share
# each pool got moves the run's figures more than anything the simulator
# models: at 4 clients a run may send 7 of 9 requests to one pool. Each
# measured level's draws are read from its workers' /metrics (the requests
# each prefilled); among SPLIT_MATCH_SEEDS (400) seeds of pdq sim, those
# whose measured requests per pool are the run's less its one unmeasured
# request (in either pool) are averaged, and set beside the run. No run's
# timing enters the prediction: only how many requests the router sent each
# pool. The seeds' results are kept in DIR/predicted-split-seeds/ (not
# committed: the same profile and seeds give the same) -> DIR/validation-split-matched.md
compare_split() {
  local c name workers flags level s seeds="${SPLIT_MATCH_SEEDS:-400}" profile="${PROFILE:-$dir/profile.json}"
  local out="$dir/predicted-split-seeds"
  mkdir -p "$out"
  for c in "${configs[@]}"; do
    IFS='|' read -r name workers flags <<<"$c"
    # Draws only: a sticky split sends each client where its prediction does.
    drawn_split "$flags" || continue
    compgen -G "$dir/measured/$name$suffix-*.json" >/dev/null || continue
    for level in "${levels[@]}"; do
      # Kept from an earlier call unless the profile is newer.
      [[ $out/$name$suffix-c$level.jsonl -nt $profile ]] && continue
      for s in $(seq "$seeds"); do
        # shellcheck disable=SC2086  # flags are words
        "$build/bin/pdq" sim --profile "$profile" $flags --prompt-tokens "$prompt_tokens" \
          --output-tokens "$output_tokens" --concurrency "$level" \
          --requests $((level * per_client)) --warmup 1 --seeds 1 --seed "$s" \
          --json "$out/one.json" >/dev/null
        python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$out/one.json"
      done >"$out/$name$suffix-c$level.jsonl"
      rm -f "$out/one.json"
    done
  done
  # The configurations with drawn splits, for the comparison below.
  CONFIGS="$(for c in "${configs[@]}"; do IFS='|' read -r name workers flags <<<"$c"; drawn_split "$flags" && printf '%s\t%s\t%s\n' "$name" "$workers" "$flags"; done)" \
    python3 - "$dir" "$suffix" <<'PY'
import glob, json, os, re, statistics, sys
d, suffix = sys.argv[1], sys.argv[2]
metrics = [("ttft", "p50"), ("ttft", "p90"), ("tpot", "p50"), ("tpot", "p90"), ("out", "")]
rows, errors = [], {f"{m} {q}".strip(): [] for m, q in metrics}
for line in os.environ["CONFIGS"].splitlines():
    name, workers, flags = line.split("\t")
    # Each worker's pool by its precision (the A/B arms differ in decode precision).
    pool_of = {w["precision"]: w["pool"] for w in json.loads(workers)}
    if len(pool_of) != len(json.loads(workers)):
        sys.exit(f"{name}: two pools' workers share a precision; compare-split tells pools by it")
    for f in sorted(glob.glob(f"{d}/measured/{name}{suffix}-*.json")):
        if not re.fullmatch(re.escape(name + suffix) + r"-\d+\.json", os.path.basename(f)):
            continue
        run = json.load(open(f))
        for level in run["levels"]:
            c = level["concurrency"]
            sent = {pool_of[w["precision"]]: int(w.get("prefills") or 0) for w in level["workers"]}
            seeds = [json.loads(l) for l in open(f"{d}/predicted-split-seeds/{name}{suffix}-c{c}.jsonl")]
            def drawn(p):
                return {a["pool"]: round(a["measured"]["mean"]) for a in p["arms"]}
            # The run's draws less its one unmeasured request, in either pool.
            wanted = [{k: v - (k == pool) for k, v in sent.items()} for pool in sent if sent[pool] > 0]
            same = [p for p in seeds if drawn(p) in wanted]
            cells = []
            for m, q in metrics:
                meas = level["output_tokens_per_s"] if m == "out" else level[f"{m}_s"][q] * 1e3
                if not same:
                    cells.append("no seed drew so")
                    continue
                key = "output_tokens_per_second" if m == "out" else f"{m}_{q}"
                vals = [p[key]["mean"] * (1 if m == "out" else 1e3) for p in same]
                pred = statistics.fmean(vals)
                err = pred / meas - 1
                errors[f"{m} {q}".strip()].append(err)
                cells.append(f"{pred:.0f} / {meas:.0f} ({err:+.0%})")
            draws = ", ".join(f"{k} {v}" for k, v in sorted(sent.items()))
            r = re.search(r"-(\d+)\.json$", f).group(1)
            rows.append(f"| {name}{suffix} run {r} | {c} | {draws} | {len(same)} | " + " | ".join(cells) + " |")
heads = [f"{m.upper()} {q} (ms)" if m != "out" else "output tokens/s" for m, q in metrics]
out = ["| run | clients | requests per pool (the router's draws) | seeds drawn alike | " + " | ".join(heads) + " |",
       "| --- | ---: | --- | ---: |" + " --- |" * len(metrics), *rows, "",
       "Each cell: the mean over the seeds that drew as the run did / the run (the error).", "",
       "| metric | bias (mean error) | median absolute error | largest absolute error |",
       "| --- | ---: | ---: | ---: |"]
for k, es in errors.items():
    if es:
        out.append(f"| {k} | {statistics.fmean(es):+.1%} | {statistics.median(abs(e) for e in es):.1%} | {max(abs(e) for e in es):.1%} |")
open(f"{d}/validation-split-matched.md", "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
}

host_speed() {
  local c name flags
  CONFIGS="$(for c in "${configs[@]}"; do
    IFS='|' read -r name _ flags <<<"$c"
    printf '%s\t%s\n' "$name" "$flags"
  done)" PROFILE="${PROFILE:-$dir/profile.json}" python3 - "$dir" <<'PY'
import glob, json, os, re, statistics, sys
d = sys.argv[1]
profile = json.load(open(os.environ["PROFILE"]))
configs = dict(line.split("\t") for line in os.environ["CONFIGS"].splitlines())
def flag(flags, name):
    m = re.search(rf"--{name} (\S+)", flags)
    return m.group(1) if m else None
def pass_of(precision, threads):
    for p in profile["passes"]:
        if p["precision"] == precision and p["threads"] == threads:
            return p
    return None
def row_step(p, rows):  # PassTime::RowStep: interpolated, held beyond the ends
    steps = p.get("row_steps", [])
    if not steps:
        return 0
    if rows <= steps[0][0]:
        return steps[0][1]
    for (r0, s0), (r1, s1) in zip(steps, steps[1:]):
        if rows <= r1:
            return s0 + (s1 - s0) * (rows - r0) / (r1 - r0)
    return steps[-1][1]
def alone(p, rows, tokens, pairs, decode_pairs=0):
    # Profiles before 2026-12 priced decode pairs as prompt pairs.
    return (p["fixed"] + p["per_row"] * rows + p["per_token"] * tokens + p["per_pair"] * pairs
            + p.get("per_decode_pair", p["per_pair"]) * decode_pairs + row_step(p, rows + tokens))
def p50_error(pred, level, metric):
    return pred[f"{metric}_p50"]["mean"] / level[f"{metric}_s"]["p50"] - 1
# TRACK_SPEED=1's speed probe before each run: "LABEL run R: PRECISION xS, ... (probe: ...)".
probes = {}
for f in (f"{d}/predicted-tracked/speed.txt", f"{d}/predicted-open-tracked/speed.txt"):
    for line in open(f) if os.path.exists(f) else []:
        m = re.match(r"(\S+) run (\d+): (.*?) \(probe", line)
        if m:
            probes[(m.group(1), int(m.group(2)))] = dict(
                (k, float(v)) for k, v in re.findall(r"(\S+) x([\d.]+)", m.group(3)))
out = ["| run | prompt passes, served / alone | decode steps, served / alone | TTFT p50 error | TPOT p50 error |"
       + (" probe before the run: passes x | tracked TTFT p50 error | tracked TPOT p50 error |" if probes else ""),
       "| --- | ---: | ---: | ---: | ---: |" + (" --- | ---: | ---: |" if probes else "")]
pairs_of, probe_pairs = [], []
for measured, predicted in (("measured", "predicted"), ("measured-open", "predicted-open")):
    for f in sorted(glob.glob(f"{d}/{measured}/*.json")):
        base = os.path.basename(f)[:-5]
        m = re.fullmatch(r"(.+?)(\.\w+)?(-f[\d.]+)?-(\d+)", base)
        name, suffix, frac, run = m.group(1), m.group(2) or "", m.group(3) or "", int(m.group(4))
        flags = configs.get(name)
        if flags is None:
            continue
        r = json.load(open(f))
        threads = int(flag(flags, "threads"))
        mono = "--deployment 1M" in flags
        prompt_p = pass_of(flag(flags, "monolithic-prefill-precision") or flag(flags, "monolithic-precision")
                           if mono else flag(flags, "prefill-precision"), threads)
        decode_p = pass_of(flag(flags, "monolithic-precision") if mono else flag(flags, "decode-precision"),
                           threads)
        for level in r["levels"]:
            prompt_ratio = decode_ratio = None
            L, out_tokens = r["input_tokens"], r["output_tokens"]
            for w in level["workers"]:
                passes = w.get("prefill_passes") or w.get("prefills") or 0
                if prompt_p and passes and w.get("prefill_busy_seconds"):
                    tokens = w["prefill_tokens"] / passes
                    # tokens / L whole prompts, each attending L * L / 2 pairs.
                    model = alone(prompt_p, 0, tokens, tokens * L / 2)
                    prompt_ratio = w["prefill_busy_seconds"] / passes / model
                if decode_p and w.get("decode_steps"):
                    steps = w["decode_steps"]
                    rows = w["decode_rows"] / steps
                    # Prompt tokens in the same pass (a monolithic worker of one model).
                    fused = mono and not flag(flags, "monolithic-prefill-precision")
                    ptok = (w.get("decode_step_prompt_tokens") or 0) / steps if fused else 0
                    model = alone(decode_p, rows, ptok, ptok * L / 2, rows * (L + (out_tokens - 1) / 2))
                    decode_ratio = w["decode_step_seconds"] / steps / model
            c = level["concurrency"]
            pf = (f"{d}/{predicted}/{name}{frac}-s{r.get('arrival_seed', 1)}.json" if frac
                  else f"{d}/{predicted}/{name}{suffix}-c{c}.json")
            errs = ["", ""]
            if os.path.exists(pf):
                pred = json.load(open(pf))
                errs = [f"{p50_error(pred, level, 'ttft'):+.0%}", f"{p50_error(pred, level, 'tpot'):+.0%}"]
                if prompt_ratio:
                    pairs_of.append((prompt_ratio, p50_error(pred, level, "ttft")))
            label = f"{name}{suffix}{frac} run {run}" + ("" if frac else f", {c} clients")
            ratio = lambda x: f"{x:.2f}" if x else ""
            row = f"| {label} | {ratio(prompt_ratio)} | {ratio(decode_ratio)} | {errs[0]} | {errs[1]} |"
            if probes:
                probe = probes.get((f"{name}{suffix}{frac}", run))
                tf = (f"{d}/predicted-open-tracked/{name}{frac}-s{run}.json" if frac
                      else f"{d}/predicted-tracked/{name}{suffix}-{run}-c{c}.json")
                terrs = ["", ""]
                if probe and os.path.exists(tf):
                    tp = json.load(open(tf))
                    terrs = [f"{p50_error(tp, level, 'ttft'):+.0%}", f"{p50_error(tp, level, 'tpot'):+.0%}"]
                scale = ", ".join(f"{k} {v:.2f}" for k, v in probe.items()) if probe else ""
                row += f" {scale} | {terrs[0]} | {terrs[1]} |"
                prompt_precision = (prompt_p or {}).get("precision")
                if probe and prompt_ratio and prompt_precision in probe:
                    probe_pairs.append((probe[prompt_precision], prompt_ratio))
            out.append(row)
out += ["", "Served / alone: the workers' mean prompt pass and decode step (their /metrics) over the",
        "profile's passes timed alone for the same mean work (decode rows over contexts from the prompt",
        "to the answer's middle). Errors: the prediction (open loop: the run's own arrivals simulated)",
        "over the run's p50, less 1."]
if len(pairs_of) > 2:
    xs, ys = zip(*pairs_of)
    out.append(f"Across {len(xs)} runs, TTFT p50 error against the prompt passes' served / alone: "
               f"correlation {statistics.correlation(xs, ys):+.2f}.")
if len(probe_pairs) > 2:
    xs, ys = zip(*probe_pairs)
    out.append(f"Across {len(xs)} runs, the probe's prompt pass scale before the run against the run's "
               f"served / alone: correlation {statistics.correlation(xs, ys):+.2f} (where one precision "
               "serves prompts and decode, its scale is the mean of the probe's two).")
open(f"{d}/host-speed.md", "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
}

"${cmd//-/_}" "$@"
