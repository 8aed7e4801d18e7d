#!/usr/bin/env bash
# Post hoc, not pre-registered: how a change to the served fit (pdq profile
# --refit-served) moves committed validation sets' closed-loop predictions.
# For each SET under bench/sim_validation, today's simulator predicts every
# chat configuration the set measured, on the set's profile refitted by
# today's rules, four ways:
#   base   without the one-row factors, the split probe's decode factors as
#          the profile recorded them (the rules before b862e57)
#   rows   with the one-row factors (served_row_factors) only
#   split  with the split probe's one decode factor only
#   both   as --refit-served writes it
# and bench/sim_validation.sh compare sets each against the set's runs.
# Everything is written under OUT (a scratch directory; nothing in the
# sets is touched), and a table of the cells within the bound is printed.
#
# Usage: bench/sim_refit_compare.sh BUILD OUT SET [SET ...]
#   e.g. bench/sim_refit_compare.sh build /tmp/refit-compare zen4-2core-2026-12-07 emr-2core-2026-12-06f
set -euo pipefail

# shellcheck source=bench/post_hoc_args.sh
source "$(dirname "$0")/post_hoc_args.sh"  # build, out, sets, here, repo
pdq="$build/bin/pdq"
[[ -x $pdq ]] || { echo "$pdq not found: build first (make build)" >&2; exit 2; }
mkdir -p "$out"
# run LOG CMD...: CMD's output to LOG; on failure, LOG's end and exit.
run() {
  local log=$1
  shift
  if ! "$@" > "$log" 2>&1; then
    tail -5 "$log" >&2
    echo "failed: $* (log: $log)" >&2
    exit 1
  fi
}
arms=(base rows split both)

printf '| set | configurations |'
for a in "${arms[@]}"; do printf ' %s: latency | %s: throughput |' "$a" "$a"; done
printf '\n| --- | --- |'
for _ in "${arms[@]}"; do printf ' ---: | ---: |'; done
printf '\n'
declare -A total_lat total_out
total_cells=0 total_out_cells=0
for set in "${sets[@]}"; do
  src="$here/sim_validation/$set"
  [[ -f $src/profile.json && -d $src/measured ]] || {
    echo "$src: no profile.json and measured/ (not a closed-loop set)" >&2
    exit 2
  }
  dst="$out/$set"
  rm -rf "$dst"
  mkdir -p "$dst"
  cp -r "$src/measured" "$src/profile.json" "$dst/"
  # Chat's configurations: measured/NAME-RUN.json (summarize and analysis apart).
  names=$(find "$dst/measured" -name '*.json' -printf '%f\n' | { grep -v '\.summarize\|\.analysis' || true; } |
    sed -E 's/-[0-9]+\.json$//' | sort -u | paste -sd, -)
  if [[ -z $names ]]; then
    echo "$src: no chat runs in measured/" >&2
    exit 2
  fi
  run "$dst/refit.log" "$pdq" profile --refit-served "$dst/profile.json" --out "$dst/profile-both.json"
  python3 - "$dst" << 'EOF'
import json, sys
d = sys.argv[1]
recorded = json.load(open(d + "/profile.json"))
refit = json.load(open(d + "/profile-both.json"))

def arm(rows, split):
    p = json.loads(json.dumps(refit))
    if not rows:
        for ps in p["passes"]:
            ps.pop("served_row_factors", None)
    if not split:
        for s, r in zip(p.get("splits", []), recorded.get("splits", [])):
            s["decode_factor"], s["decode_pair_factor"] = r["decode_factor"], r["decode_pair_factor"]
    return p

for name, rows, split in [("base", False, False), ("rows", True, False), ("split", False, True)]:
    json.dump(arm(rows, split), open(f"{d}/profile-{name}.json", "w"), indent=2)
EOF
  printf '| %s | %s |' "$set" "${names//,/, }"
  for a in "${arms[@]}"; do
    run "$dst/predict-$a.log" env PROFILE="$dst/profile-$a.json" PREDICTED="$a" \
      "$here/sim_validation.sh" predict "$build" "$dst" "$names"
    run "$dst/compare-$a.log" env PREDICTED="$a" "$here/sim_validation.sh" compare "$dst"
    # "| ttft p50 | ... | 8 of 9 |": the last column of the summary table.
    read -r lat cells out_ok out_cells < <(awk -F'|' '
      /^\| (ttft|tpot) p(50|90) / { split($6, a, " "); l += a[1]; n += a[3] }
      /^\| out / { split($6, a, " "); o = a[1]; m = a[3] }
      END { print l + 0, n + 0, o + 0, m + 0 }' "$dst/validation-$a.md")
    printf ' %d of %d | %d of %d |' "$lat" "$cells" "$out_ok" "$out_cells"
    total_lat[$a]=$((${total_lat[$a]:-0} + lat))
    total_out[$a]=$((${total_out[$a]:-0} + out_ok))
  done
  printf '\n'
  total_cells=$((total_cells + cells))
  total_out_cells=$((total_out_cells + out_cells))
done
printf '| all | |'
for a in "${arms[@]}"; do
  printf ' %d of %d | %d of %d |' "${total_lat[$a]}" "$total_cells" "${total_out[$a]}" "$total_out_cells"
done
printf '\n'
