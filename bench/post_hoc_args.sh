# shellcheck shell=bash disable=SC2034  # sourced: its variables are the caller's
# The arguments of the post hoc simulator scripts (bench/sim_eval_ratio.sh,
# bench/sim_refit_compare.sh), both BUILD OUT SET [SET ...]: source it after
# `set -euo pipefail`. -h or --help prints the script's header comment (line
# 2 up to its `set -euo`), fewer than three arguments print it and exit 2.
# Sets build= and out=, sets=(the rest), here= (bench/) and repo= (both
# physical paths), and refuses an OUT inside the repository before anything
# is made there.
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  usage
  exit 0
fi
if [[ $# -lt 3 ]]; then
  usage >&2
  exit 2
fi
build=$1 out=$2
sets=("${@:3}")
here=$(cd "$(dirname "$0")" && pwd -P)
repo=$(cd "$here/.." && pwd -P)
if [[ $(realpath -m "$out") == "$repo" || $(realpath -m "$out") == "$repo"/* ]]; then
  echo "OUT=$out lies in the repository: give a scratch directory" >&2
  exit 2
fi
