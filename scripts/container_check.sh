#!/usr/bin/env bash
# Builds deploy/container/Containerfile and serves one request from it, on a
# machine where no image registry is reachable and no OCI runtime can start a
# container: the Debian 12 base images are made here with debootstrap, the
# image is built with buildah's chroot isolation, and pdq-router, pdq-prefill
# and pdq-decode run out of the built image (buildah run, chroot isolation).
# Run it whenever a change touches the Containerfile, the dependencies or the
# build.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/container_check.sh [options] [WORKDIR]

Builds deploy/container/Containerfile from the repository's committed tree
(git archive of REF, not the working tree) and proves the image serves:
  1. base     a Debian 12 (bookworm) root made with debootstrap (variant
              minbase), imported into buildah's local storage as debian:12
              and debian:12-slim (docker.io/library/debian:12[-slim], what
              the Containerfile's FROM lines resolve to); no registry is used
  2. build    buildah bud --isolation chroot --network host --pull=never,
              tagged TAG
  3. model    the image's /opt/pdq/scripts/fetch_model.sh downloads the model
              from PyPI, as the Kubernetes init containers do (or --model)
  4. serve    pdq-router, pdq-prefill (W8A8) and pdq-decode (W4A16), each in
              its own working container of the image, on 127.0.0.1; one
              OpenAI chat request over HTTP from this machine and one
              `pdq client` request from the image must both answer; then all
              three are stopped with SIGTERM and must exit 0
Needs root, buildah and debootstrap (installed with apt-get when missing),
git, curl and python3, about 6 GB free in WORKDIR and /var/lib/containers,
and network access to a Debian mirror and PyPI.

WORKDIR            where the cached base root, the model, the logs and the
                   build context go (default /var/tmp/pdq-container-check)
--ref REF          commit of the repository to build (default HEAD)
--containerfile F  build with F instead of REF's deploy/container/Containerfile
                   (to try an uncommitted change; the context stays REF's tree)
--tag NAME         the image's name (default pdq:dev)
--rebuild-base     debootstrap again even when WORKDIR holds a cached base root
                   (base-bookworm-minbase-ARCH.tar) and re-import it
--no-cache         build every step again (by default buildah reuses the
                   layers of earlier runs whose inputs did not change)
--model FILE       serve this GGUF file (SmolLM2-135M-Instruct Q4_1) from this
                   machine instead of fetching it with the image's script
--mirror URL       Debian mirror (default: the one apt uses on this machine)
--no-host-ca       do not lend the image this machine's CA bundle while it
                   fetches the model (a network that intercepts TLS needs it
                   for PyPI); the bundle is bind-mounted, never built in
--keep             keep the working containers and the build context
-h, --help         this text

The log is WORKDIR/container_check.log; each served process's output is in
WORKDIR/serve/. The base images, TAG and the layers a rerun reuses stay in
buildah's storage (`buildah images`); layers of earlier builds are left as
untagged images, which `buildah rmi --prune` removes (with the cache).
EOF
}

ref=HEAD
containerfile=""
tag=pdq:dev
rebuild_base=0
no_cache=0
model_file=""
mirror=""
host_ca=1
keep=0
workdir=/var/tmp/pdq-container-check
while [ $# -gt 0 ]; do
  case "$1" in
    --ref) ref="${2:?--ref needs a value}"; shift ;;
    --ref=*) ref="${1#*=}" ;;
    --containerfile) containerfile="${2:?--containerfile needs a value}"; shift ;;
    --containerfile=*) containerfile="${1#*=}" ;;
    --tag) tag="${2:?--tag needs a value}"; shift ;;
    --tag=*) tag="${1#*=}" ;;
    --rebuild-base) rebuild_base=1 ;;
    --no-cache) no_cache=1 ;;
    --model) model_file="${2:?--model needs a value}"; shift ;;
    --model=*) model_file="${1#*=}" ;;
    --mirror) mirror="${2:?--mirror needs a value}"; shift ;;
    --mirror=*) mirror="${1#*=}" ;;
    --no-host-ca) host_ca=0 ;;
    --keep) keep=1 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "container-check: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) workdir="$1" ;;
  esac
  shift
done

if [ "$(id -u)" -ne 0 ]; then
  echo "container-check: must run as root (debootstrap, buildah's chroot isolation)" >&2
  exit 2
fi
for need in git:git curl:curl python3:python3 pgrep:procps; do
  if ! command -v "${need%%:*}" >/dev/null; then
    echo "container-check: ${need%%:*} is needed on this machine (Debian: apt-get install ${need#*:})" >&2
    exit 2
  fi
done
if [ -n "$containerfile" ] && [ ! -f "$containerfile" ]; then
  echo "container-check: --containerfile $containerfile: no such file" >&2
  exit 2
fi
if [ -n "$model_file" ] && [ ! -f "$model_file" ]; then
  echo "container-check: --model $model_file: no such file" >&2
  exit 2
fi
[ -n "$containerfile" ] && containerfile=$(realpath "$containerfile")
[ -n "$model_file" ] && model_file=$(realpath "$model_file")

suite=bookworm
arch=$(dpkg --print-architecture)
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
commit=$(git -C "$repo" rev-parse --verify "$ref^{commit}")
mkdir -p "$workdir"
workdir=$(cd "$workdir" && pwd)
base_tar="$workdir/base-$suite-minbase-$arch.tar"
context="$workdir/context"
serve_dir="$workdir/serve"
log="$workdir/container_check.log"
build_log="$workdir/build.log"
model_name=SmolLM2-135M-Instruct.Q4_1.gguf
# What `FROM debian:12` and `FROM debian:12-slim` resolve to (the short-name
# alias in /etc/containers/registries.conf.d/shortnames.conf).
base_images=(docker.io/library/debian:12 docker.io/library/debian:12-slim)
# The working containers this script makes; a leftover from an interrupted
# run is removed first.
ctr_prefix=pdq-container-check
roles=(router prefill decode)
exec > >(tee "$log") 2>&1
rm -f "$build_log.rc" "$build_log.pid"  # the trap reads them

# --- the mirror apt uses here (as scripts/fresh_box_check.sh finds it) ----------
# host_uri_for SUITE (scripts/debian_mirror.sh)
# shellcheck source=scripts/debian_mirror.sh
source "$(dirname "$0")/debian_mirror.sh"

if [ -z "$mirror" ]; then mirror=$(host_uri_for "$suite"); fi
if [ -z "$mirror" ]; then
  echo "container-check: no apt source for $suite found on this machine; pass --mirror URL" >&2
  exit 2
fi
security_uri=$(host_uri_for "$suite-security")

# --- phases, timing, cleanup -------------------------------------------------------
start_all=$(date +%s)
phase_names=()
phase_secs=()
current_phase=""
failed_what=""
result=FAIL
image_size=""
answer=""
declare -A run_pid=()      # role -> pid of its `buildah run`

fmt() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

phase() {
  current_phase=$1
  phase_start=$(date +%s)
  echo
  echo "=== container-check: $1 ($(date -u +%H:%M:%S) UTC) ==="
}

phase_done() {
  local secs=$(($(date +%s) - phase_start))
  phase_names+=("$current_phase")
  phase_secs+=("$secs")
  echo "=== container-check: $current_phase took $(fmt "$secs") ==="
  current_phase=""
}

fail() {  # fail WHAT MESSAGE...: says why and ends the run (the trap summarizes)
  failed_what=$1
  shift
  echo "container-check: $*" >&2
  exit 1
}

# The process a `buildah run` started: buildah run -> buildah-chroot-runtime
# -> buildah-chroot-exec -> the command. A SIGTERM to `buildah run` itself
# SIGKILLs the command, so a clean stop signals the command directly. The
# helpers are told apart by argv[0]: their comm is "memfd:..." (buildah runs
# them from a memfd copy of itself).
payload_pid() {
  local pid=$1 child argv0
  while :; do
    argv0=$(tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null | head -1) || return 1
    case "${argv0##*/}" in
      buildah*) ;;
      "") return 1 ;;
      *) echo "$pid"; return 0 ;;
    esac
    child=$(pgrep -P "$pid" | head -1) || return 1
    [ -n "$child" ] || return 1
    pid=$child
  done
}

# Stops the served processes: SIGTERM to each command (decode and prefill
# before the router, as an orchestrator would), then waits for its `buildah
# run` to end. Prints each exit status; returns 1 when one was not 0.
stop_served() {
  local role pid p rc bad=0 i
  for role in decode prefill router; do
    pid=${run_pid[$role]:-}
    [ -n "$pid" ] || continue
    if p=$(payload_pid "$pid"); then kill -TERM "$p" 2>/dev/null || true; fi
  done
  for role in decode prefill router; do
    pid=${run_pid[$role]:-}
    [ -n "$pid" ] || continue
    for ((i = 0; i < 300; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "container-check: $role did not stop within 30 s of SIGTERM; killing it"
      kill -KILL "$pid" 2>/dev/null || true
      bad=1
    fi
    rc=0
    wait "$pid" 2>/dev/null || rc=$?
    echo "container-check: $role exited with status $rc"
    [ "$rc" -eq 0 ] || bad=1
    unset "run_pid[$role]"
  done
  return "$bad"
}

# make_container NAME: a working container of the image, one per served
# process (as each runs in its own pod), and "client" for the CLI.
make_container() {
  buildah inspect --type container "$ctr_prefix-$1" >/dev/null 2>&1 ||
    buildah from --pull=never --name "$ctr_prefix-$1" "$tag" >/dev/null
}

remove_containers() {
  local name
  for name in "${roles[@]}" client; do
    if buildah inspect --type container "$ctr_prefix-$name" >/dev/null 2>&1; then
      buildah rm "$ctr_prefix-$name" >/dev/null || echo "container-check: could not remove container $ctr_prefix-$name" >&2
    fi
  done
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  if [ -n "$current_phase" ]; then
    [ -z "$failed_what" ] && failed_what=$current_phase
    { [ "$rc" -eq 130 ] || [ "$rc" -eq 143 ]; } && failed_what="interrupted during $current_phase"
    phase_names+=("$current_phase (failed)")
    phase_secs+=("$(($(date +%s) - phase_start))")
  fi
  if [ ${#run_pid[@]} -gt 0 ]; then
    # A worker still loading the model takes SIGTERM once it has loaded.
    echo "container-check: stopping the served processes"
    stop_served
  fi
  if [ -f "$build_log.pid" ] && [ ! -f "$build_log.rc" ]; then
    local bud c i
    bud=$(cat "$build_log.pid")
    kill -TERM "$bud" 2>/dev/null && echo "container-check: stopping the build"
    for ((i = 0; i < 100; i++)); do kill -0 "$bud" 2>/dev/null || break; sleep 0.1; done
    # An interrupted buildah bud leaves its working container behind.
    for c in $(buildah containers --quiet 2>/dev/null); do
      grep -qx "$c" "$workdir/containers-before-build" 2>/dev/null ||
        buildah rm "$c" >/dev/null 2>&1 || true
    done
  fi
  rm -f "$build_log.rc" "$build_log.pid" "$workdir/containers-before-build"
  if [ "$keep" -eq 1 ]; then
    echo "container-check: kept the working containers ($ctr_prefix-*) and $context"
  else
    remove_containers
    rm -rf "$context"
  fi
  local total=$(($(date +%s) - start_all)) i
  echo
  echo "=== container-check: summary (commit ${commit:0:12}, Debian $suite $arch, $(nproc) cores, $(buildah --version)) ==="
  for i in "${!phase_names[@]}"; do
    printf '  %-34s %s\n' "${phase_names[i]}" "$(fmt "${phase_secs[i]}")"
  done
  printf '  %-34s %s\n' "total" "$(fmt "$total")"
  [ -n "$image_size" ] && echo "  image $tag: $image_size"
  [ -n "$answer" ] && echo "  answer: $answer"
  if [ "$result" = PASS ] && [ "$rc" -eq 0 ]; then
    echo "container-check: PASS (built $tag and served a request from it, $(fmt "$total"))"
  else
    echo "container-check: FAIL${failed_what:+ ($failed_what)} after $(fmt "$total"); log: $log"
    [ "$rc" -eq 0 ] && rc=1
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "container-check: repository $repo, commit $commit"
echo "container-check: work dir $workdir, mirror $mirror${security_uri:+, security $security_uri}"
[ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ] &&
  echo "container-check: note: the working tree has uncommitted changes; they are not built (the context is $ref)"

# --- 0. the tools -------------------------------------------------------------------
missing=()
command -v buildah >/dev/null || missing+=(buildah)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  phase "install ${missing[*]} on this machine"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  phase_done
fi
echo "container-check: $(buildah --version), storage driver $(buildah info --format '{{.store.GraphDriverName}}')"
remove_containers  # leftovers of an interrupted run

# --- 1. the base images: debian:12 and debian:12-slim, made here -------------------
phase "base images (debootstrap $suite minbase)"
if [ "$rebuild_base" -eq 1 ] || [ ! -f "$base_tar" ]; then
  # The pristine debootstrap root is cached as a tar, as fresh_box_check.sh
  # --reuse-base does; the apt configuration is added at import below.
  root="$workdir/root"
  rm -rf --one-file-system "$root"
  debootstrap --variant=minbase --arch="$arch" "$suite" "$root" "$mirror"
  echo "container-check: saving the base root to $base_tar"
  tar -C "$root" -cpf "$base_tar.tmp" --numeric-owner . && mv "$base_tar.tmp" "$base_tar"
  rm -rf --one-file-system "$root"
fi
base_sum=$(sha256sum "$base_tar" | cut -d' ' -f1)
# Re-importing would give the base a new id and so invalidate every cached
# layer of the build; an import of the same tar is kept.
have=$(buildah inspect --type image --format '{{index .OCIv1.Config.Labels "pdq.container-check.base-root"}}' \
  "${base_images[0]}" 2>/dev/null || true)
if [ "$rebuild_base" -eq 0 ] && [ "$have" = "sha256:$base_sum" ]; then
  echo "container-check: ${base_images[*]} already imported from this base root"
else
  ctr=$(buildah from --name "$ctr_prefix-base" scratch)
  mnt=$(buildah mount "$ctr")
  tar -C "$mnt" -xpf "$base_tar" --numeric-owner
  # What the official image has and a bare debootstrap root lacks or has
  # extra: deb822 apt sources with -updates and -security, no package lists
  # or downloaded .debs, and a policy-rc.d that stops package scripts from
  # starting services.
  rm -f "$mnt/etc/apt/sources.list" "$mnt"/var/cache/apt/archives/*.deb
  rm -rf "$mnt"/var/lib/apt/lists/*
  signed_by="Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
  {
    printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\n%s\n' \
      "$mirror" "$suite" "$suite" "$signed_by"
    if [ -n "$security_uri" ]; then
      printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\n%s\n' \
        "$security_uri" "$suite" "$signed_by"
    fi
  } > "$mnt/etc/apt/sources.list.d/debian.sources"
  printf '#!/bin/sh\nexit 101\n' > "$mnt/usr/sbin/policy-rc.d"
  chmod 755 "$mnt/usr/sbin/policy-rc.d"
  buildah umount "$ctr" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd bash --label "pdq.container-check.base-root=sha256:$base_sum" "$ctr"
  # One minbase root serves as both: debian:12-slim differs from debian:12
  # only by leaving out documentation and locales, which nothing here needs.
  buildah commit --quiet --rm "$ctr" "${base_images[0]}" >/dev/null
  buildah tag "${base_images[0]}" "${base_images[1]}"
  echo "container-check: imported ${base_images[*]}"
fi
buildah images "${base_images[0]}"
phase_done

# --- 2. the image, built from the committed tree -------------------------------------
phase "build $tag"
rm -rf "$context"
mkdir -p "$context"
git -C "$repo" archive --format=tar "$commit" | tar -C "$context" -xf -
echo "container-check: context: $ref (${commit:0:12}), $(du -sh "$context" | cut -f1)"
file="$context/deploy/container/Containerfile"
if [ -n "$containerfile" ]; then
  cmp -s "$containerfile" "$file" ||
    echo "container-check: note: building with $containerfile, which differs from $ref's"
  file=$containerfile
elif ! git -C "$repo" diff --quiet "$commit" -- deploy/container/Containerfile; then
  echo "container-check: note: the working tree's Containerfile differs from $ref's;" \
    "building $ref's (--containerfile deploy/container/Containerfile tries the other)"
fi
bud_args=(--isolation chroot --network host --pull=never --layers -f "$file" -t "$tag")
[ "$no_cache" -eq 1 ] && bud_args+=(--no-cache)
# nice: the build stage compiles pdq on every core; other work on the machine
# keeps its share. Each output line gets the time since the build started, so
# that the summary below can say what each step took.
t0=$(date +%s)
rm -f "$build_log.rc" "$build_log.pid"
buildah containers --quiet > "$workdir/containers-before-build"
{
  nice -n 10 buildah bud "${bud_args[@]}" "$context" 2>&1 < /dev/null &
  echo $! > "$build_log.pid"  # for the trap: an interrupted run stops the build
  wait $!
  echo $? > "$build_log.rc"
} | while IFS= read -r line; do
  printf -v now '%(%s)T' -1
  printf '[+%s] %s\n' "$(fmt $((now - t0)))" "$line"
done | tee "$build_log" &
wait $! || true
[ "$(cat "$build_log.rc" 2>/dev/null || echo 1)" -eq 0 ] || fail "build $tag" "buildah bud failed; see $build_log"
echo "container-check: what each build step took (a cached step takes 0s):"
# Lines read "[+1m44s] [1/2] STEP 6/7: COPY . ."; a step lasts until the next
# step, or the final commit, starts.
awk '
  function secs(t) { split(substr(t, 3), a, /[ms]/); return a[1] * 60 + a[2] }
  function show() { if (name != "") printf "  %4ds  %s\n", secs($1) - start, substr(name, 1, 96) }
  / STEP [0-9]+\/[0-9]+: / { show(); start = secs($1); name = $0; sub(/^[^]]*\] /, "", name) }
  / COMMIT / { show(); name = "" }
' "$build_log" || true
image_size=$(buildah images --format '{{.Size}}' "$tag" | head -1)
echo "container-check: $tag: $image_size ($(buildah images --format '{{.ID}}' "$tag" | head -1))"
phase_done

# --- 3. the model, as the init containers fetch it ------------------------------------
phase "model"
mkdir -p "$serve_dir"
rm -f "$serve_dir"/*.addr "$serve_dir"/*.http "$serve_dir"/*.log
# The image runs as 65532; the address files go here.
chmod 1777 "$serve_dir"
if [ -n "$model_file" ]; then
  model_mount=(-v "$model_file:/models/$model_name:ro")
  echo "container-check: serving $model_file (--model)"
else
  models="$workdir/models"
  rm -rf "$models"   # fetched every run: that is what the image's script is for
  mkdir -p "$models"
  chown 65532:65532 "$models"
  ca_mount=()
  if [ "$host_ca" -eq 1 ] && [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    ca_mount=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
  fi
  make_container client
  # As deploy/k8s/base/*.yaml's init containers: the image's user, HOME=/tmp,
  # no pip cache, the model volume at /models.
  if ! buildah run --isolation chroot --network host "${ca_mount[@]}" -v "$models:/models" \
      -e HOME=/tmp -e PIP_NO_CACHE_DIR=1 "$ctr_prefix-client" -- \
      /opt/pdq/scripts/fetch_model.sh /models < /dev/null; then
    fail model "the image's fetch_model.sh failed (a network that intercepts TLS needs the host CA: drop --no-host-ca; or pass --model FILE)"
  fi
  model_mount=(-v "$models:/models:ro")
fi
phase_done

# --- 4. serve: router, prefill, decode, each from the image --------------------------
phase "serve one request"
for role in "${roles[@]}" client; do make_container "$role"; done

# start ROLE ARGS...: runs the image's command in ROLE's working container, in
# the background, as the image's user, with the model and $serve_dir mounted.
start() {
  local role=$1
  shift
  buildah run --isolation chroot --network host "${model_mount[@]}" -v "$serve_dir:/run/pdq" \
    "$ctr_prefix-$role" -- "$@" > "$serve_dir/$role.log" 2>&1 < /dev/null &
  run_pid[$role]=$!
}

# wait_file ROLE FILE: waits up to 5 minutes for ROLE to write FILE.
wait_file() {
  local role=$1 file=$2 i
  for ((i = 0; i < 3000; i++)); do
    [ -s "$file" ] && return 0
    if ! kill -0 "${run_pid[$role]}" 2>/dev/null; then
      tail -20 "$serve_dir/$role.log"
      fail "serve: $role" "$role ended before it was serving (log above, $serve_dir/$role.log)"
    fi
    sleep 0.1
  done
  tail -20 "$serve_dir/$role.log"
  fail "serve: $role" "$role did not write $file in 5 minutes"
}

client() {  # client ARGS...: runs the image's pdq CLI
  buildah run --isolation chroot --network host "$ctr_prefix-client" -- pdq "$@" < /dev/null
}

model="/models/$model_name"
# Loopback only, every port picked by the kernel (port 0) and reported through
# an address file, as `pdq up` does. A small KV cache: one request.
start router pdq-router --listen=127.0.0.1:0 --address-file=/run/pdq/router.addr \
  --http-listen=127.0.0.1:0 --http-address-file=/run/pdq/router.http \
  --metrics-listen=127.0.0.1:0 --drain-seconds=5 --model="$model"
wait_file router "$serve_dir/router.addr"
wait_file router "$serve_dir/router.http"
router=$(cat "$serve_dir/router.addr")
http=$(cat "$serve_dir/router.http")
echo "container-check: router at $router, OpenAI API at http://$http/v1"
start prefill pdq-prefill --model="$model" --precision=w8a8 --threads=1 \
  --listen=127.0.0.1:0 --address-file=/run/pdq/prefill.addr --metrics-listen=127.0.0.1:0 \
  --router="$router" --worker-id=prefill-0 --kv-transport=tcp --kv-tokens=4096 --drain-seconds=5
start decode pdq-decode --model="$model" --precision=w4a16 --threads=1 \
  --listen=127.0.0.1:0 --address-file=/run/pdq/decode.addr --metrics-listen=127.0.0.1:0 \
  --router="$router" --worker-id=decode-0 --kv-transport=tcp --kv-tokens=4096 --drain-seconds=5
wait_file prefill "$serve_dir/prefill.addr"
wait_file decode "$serve_dir/decode.addr"
for role in "${roles[@]}"; do
  p=$(payload_pid "${run_pid[$role]}") &&
    echo "container-check: $role: pid $p, uid $(stat -c %u "/proc/$p"), $(cat "$serve_dir/$role.addr")"
done
# Serving once both workers have registered (pdq status from the image).
registered=0
for ((i = 0; i < 60; i++)); do
  if status=$(client status --router "$router" 2>&1) && grep -q ' 2 live workers' <<<"$status"; then
    registered=1
    break
  fi
  sleep 0.5
done
echo "$status"
[ "$registered" -eq 1 ] || fail "serve: registration" "the workers did not both register with the router"

# One request as a user sends it: the OpenAI chat API over HTTP, from here.
model_id=$(curl -sS --max-time 10 "http://$http/v1/models" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])') ||
  fail "serve: /v1/models" "GET http://$http/v1/models failed"
request=$(python3 -c 'import json, sys; print(json.dumps({"model": sys.argv[1], "max_tokens": 32,
  "temperature": 0, "messages": [{"role": "user", "content": "What is the capital of France?"}]}))' "$model_id")
echo "container-check: POST http://$http/v1/chat/completions $request"
response=$(curl -sS --max-time 120 -H 'Content-Type: application/json' -d "$request" \
  "http://$http/v1/chat/completions") || fail "serve: HTTP request" "the chat request failed"
echo "$response"
answer=$(python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"].strip())' \
  <<<"$response" 2>/dev/null) || true
[ -n "$answer" ] || fail "serve: HTTP request" "no answer in the chat response (above)"
answer=${answer//$'\n'/ }
echo "container-check: answer over HTTP: $answer"

# And one through gRPC with the image's own CLI.
echo "container-check: pdq client --chat from the image"
out=$(client client --router "$router" --chat --max-tokens 32 --quiet \
  --prompt "Name a primary colour.") || fail "serve: pdq client" "pdq client failed: $out"
echo "$out"
[ -n "$(tr -d '[:space:]' <<<"$out")" ] || fail "serve: pdq client" "pdq client answered nothing"

echo "container-check: stopping decode, prefill and router (SIGTERM)"
stop_served || fail "serve: stop" "not every process stopped cleanly (logs in $serve_dir)"
phase_done

result=PASS
