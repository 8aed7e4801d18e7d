#!/usr/bin/env bash
# Proves the README's two commands on a machine that never saw the project:
# builds a bare Debian 12 (bookworm, debootstrap minbase) root, puts a clean
# clone of the repository's committed HEAD in it (not the working tree), and
# runs `make test` then `make demo` there as root in a chroot.
# Run it whenever a change touches the dependencies or the build.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/fresh_box_check.sh [options] [WORKDIR]

Runs the README's `make test` and `make demo` on a fresh Debian 12 root made
with debootstrap (variant minbase), in a chroot, as root. Needs root, about
6 GB free in WORKDIR and network access to a Debian mirror and PyPI.

WORKDIR            where the root, the log and the cached base go
                   (default /var/tmp/pdq-fresh-box)
--keep             keep the root after the run (WORKDIR/root) for inspection;
                   the mounts are removed either way
--reuse-base       start from WORKDIR/base-bookworm-minbase-ARCH.tar, a
                   pristine debootstrap root saved by an earlier --reuse-base
                   run (made and saved now if absent); the default run
                   bootstraps from scratch and saves nothing
--ref REF          commit of the repository to test (default HEAD)
--mirror URL       Debian mirror (default: the one apt uses on this machine)
--no-host-ca       do not copy this machine's local CA certificates
                   (/usr/local/share/ca-certificates) into the root; a network
                   that intercepts TLS needs them for PyPI
-h, --help         this text

Inside the root the clone is /work/pdq and, when ../shared/data exists beside
this repository, it is bind-mounted read-only at /work/shared/data (the
project reads WikiText from ../shared/data). Before the two commands the root
gets only what a Debian 12 machine has on its own: apt sources for the
mirror, /etc/resolv.conf, and `make` (the one package the commands themselves
need to start). The log is WORKDIR/fresh_box_check.log.
EOF
}

keep=0
reuse_base=0
ref=HEAD
mirror=""
host_ca=1
workdir=/var/tmp/pdq-fresh-box
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) keep=1 ;;
    --reuse-base) reuse_base=1 ;;
    --ref) ref="${2:?--ref needs a value}"; shift ;;
    --ref=*) ref="${1#*=}" ;;
    --mirror) mirror="${2:?--mirror needs a value}"; shift ;;
    --mirror=*) mirror="${1#*=}" ;;
    --no-host-ca) host_ca=0 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "fresh-box: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) workdir="$1" ;;
  esac
  shift
done

if [ "$(id -u)" -ne 0 ]; then
  echo "fresh-box: must run as root (debootstrap, mount, chroot)" >&2
  exit 2
fi

suite=bookworm
arch=$(dpkg --print-architecture)
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
commit=$(git -C "$repo" rev-parse --verify "$ref^{commit}")
shared_data="$(dirname "$repo")/shared/data"
mkdir -p "$workdir"
workdir=$(cd "$workdir" && pwd)
root="$workdir/root"
base_tar="$workdir/base-$suite-minbase-$arch.tar"
log="$workdir/fresh_box_check.log"
stage_log="$workdir/last_stage.log"  # the output of the latest command in the root
failed_what=""
exec > >(tee "$log") 2>&1

# --- the mirror apt uses here -------------------------------------------------
# host_uri_for SUITE (scripts/debian_mirror.sh)
# shellcheck source=scripts/debian_mirror.sh
source "$(dirname "$0")/debian_mirror.sh"

if [ -z "$mirror" ]; then mirror=$(host_uri_for "$suite"); fi
if [ -z "$mirror" ]; then
  echo "fresh-box: no apt source for $suite found on this machine; pass --mirror URL" >&2
  exit 2
fi
updates_uri=$(host_uri_for "$suite-updates")
security_uri=$(host_uri_for "$suite-security")

# --- stages, timing, cleanup -----------------------------------------------------
start_all=$(date +%s)
stage_names=()
stage_secs=()
current_stage=""
result=FAIL
mounts=()

fmt() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

stage() {
  current_stage=$1
  stage_start=$(date +%s)
  echo
  echo "=== fresh-box: $1 ($(date -u +%H:%M:%S) UTC) ==="
}

stage_done() {
  local secs=$(($(date +%s) - stage_start))
  stage_names+=("$current_stage")
  stage_secs+=("$secs")
  echo "=== fresh-box: $current_stage took $(fmt "$secs") ==="
  current_stage=""
}

mounted_under_root() {
  awk -v r="$root" '$5 == r || index($5, r "/") == 1 { print $5 }' /proc/self/mountinfo
}

kill_root_processes() {
  local p pids=()
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && pids+=("${p#/proc/}")
  done
  if [ ${#pids[@]} -gt 0 ]; then
    echo "fresh-box: stopping processes still running in the root: ${pids[*]}"
    kill "${pids[@]}" 2>/dev/null || true
    sleep 2
    kill -9 "${pids[@]}" 2>/dev/null || true
  fi
}

unmount_all() {
  local i m
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    m=${mounts[i]}
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || echo "fresh-box: could not unmount $m" >&2
  done
  mounts=()
  # Mounts the tests made inside (ip netns binds /run/netns), deepest first.
  for m in $(mounted_under_root | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || echo "fresh-box: could not unmount $m" >&2
  done
}

remove_root() {
  [ -d "$root" ] || return 0
  if [ -n "$(mounted_under_root)" ]; then
    echo "fresh-box: not removing $root, still mounted inside: $(mounted_under_root | tr '\n' ' ')" >&2
    return 1
  fi
  rm -rf --one-file-system "$root"
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  if [ -n "$current_stage" ]; then
    [ -z "$failed_what" ] && failed_what=$current_stage
    [ "$rc" -eq 130 ] || [ "$rc" -eq 143 ] && failed_what="interrupted during $current_stage"
    stage_names+=("$current_stage (failed)")
    stage_secs+=("$(($(date +%s) - stage_start))")
  fi
  kill_root_processes
  unmount_all
  if [ "$keep" -eq 1 ]; then
    echo "fresh-box: root kept at $root"
  elif [ -d "$root" ]; then
    echo "fresh-box: removing the root"
    remove_root
  fi
  local total=$(($(date +%s) - start_all)) i
  echo
  echo "=== fresh-box: summary (commit ${commit:0:12}, Debian $suite $arch, $(nproc) cores) ==="
  for i in "${!stage_names[@]}"; do
    printf '  %-34s %s\n' "${stage_names[i]}" "$(fmt "${stage_secs[i]}")"
  done
  printf '  %-34s %s\n' "total" "$(fmt "$total")"
  if [ "$result" = PASS ] && [ "$rc" -eq 0 ]; then
    echo "fresh-box: PASS (make test and make demo on a fresh Debian $suite, $(fmt "$total"))"
  else
    echo "fresh-box: FAIL${failed_what:+ ($failed_what)} after $(fmt "$total"); log: $log"
    [ "$rc" -eq 0 ] && rc=1
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

bind() {  # bind SRC DEST [ro]
  mkdir -p "$2"
  mount --bind "$1" "$2"
  mounts+=("$2")
  if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$2"; fi
}

# Runs a command line in the root as a fresh login would: root's HOME, the
# standard PATH, nothing from this shell's environment. Each output line gets
# the time since the command started; the lines also go to $stage_log. It runs
# in the background so that a TERM or INT reaches the trap at once.
in_root() {
  local t0 rc
  t0=$(date +%s)
  rm -f "$stage_log.rc"
  {
    chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      /bin/bash -c "$1" 2>&1 < /dev/null
    echo $? > "$stage_log.rc"
  } | while IFS= read -r line; do
    printf -v now '%(%s)T' -1
    printf '[+%s] %s\n' "$(fmt $((now - t0)))" "$line"
  done | tee "$stage_log" &
  wait $! || true
  rc=$(cat "$stage_log.rc" 2>/dev/null || echo 1)
  return "$rc"
}

# The [+time] of the first line of $stage_log matching a pattern.
when() { grep -m1 -E "$1" "$stage_log" | sed -n 's/^\[+\([^]]*\)\].*/\1/p'; }

echo "fresh-box: repository $repo, commit $commit"
echo "fresh-box: work dir $workdir, mirror $mirror${security_uri:+, security $security_uri}"
[ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ] &&
  echo "fresh-box: note: the working tree has uncommitted changes; they are not tested (the clone is of $ref)"

# --- 1. a bare Debian 12 --------------------------------------------------------
if [ -e "$root" ]; then
  echo "fresh-box: removing the previous root $root"
  kill_root_processes
  for m in $(mounted_under_root | sort -r); do umount "$m" || umount -l "$m"; done
  remove_root
fi
if ! command -v debootstrap >/dev/null; then
  stage "install debootstrap on this machine"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap
  stage_done
fi

if [ "$reuse_base" -eq 1 ] && [ -f "$base_tar" ]; then
  stage "unpack cached base root"
  mkdir -p "$root"
  tar -C "$root" -xpf "$base_tar" --numeric-owner
  stage_done
else
  stage "debootstrap $suite minbase"
  debootstrap --variant=minbase --arch="$arch" "$suite" "$root" "$mirror"
  if [ "$reuse_base" -eq 1 ]; then
    echo "fresh-box: saving the pristine base root to $base_tar"
    tar -C "$root" -cpf "$base_tar.tmp" --numeric-owner . && mv "$base_tar.tmp" "$base_tar"
  fi
  stage_done
fi

# --- 2. what any Debian 12 machine has: apt sources, DNS, make ------------------
stage "prepare root (apt sources, make)"
rm -f "$root/etc/apt/sources.list"
signed_by=""
[ -f "$root/usr/share/keyrings/debian-archive-keyring.gpg" ] &&
  signed_by="Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
{
  printf 'Types: deb\nURIs: %s\nSuites: %s%s\nComponents: main\n%s\n' \
    "$mirror" "$suite" "${updates_uri:+ $suite-updates}" "$signed_by"
  if [ -n "$updates_uri" ] && [ "$updates_uri" != "$mirror" ]; then
    echo "fresh-box: note: $suite-updates comes from $updates_uri here; using $mirror for it" >&2
  fi
  if [ -n "$security_uri" ]; then
    printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\n%s\n' \
      "$security_uri" "$suite" "$signed_by"
  fi
} > "$root/etc/apt/sources.list.d/debian.sources"
cat "$root/etc/apt/sources.list.d/debian.sources"
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
# A chroot must not start services from package scripts.
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
if [ "$host_ca" -eq 1 ] && compgen -G "/usr/local/share/ca-certificates/*" >/dev/null; then
  # Picked up by update-ca-certificates when install_deps.sh installs
  # ca-certificates; the site's network may need them for HTTPS.
  echo "fresh-box: copying this machine's local CA certificates: $(ls /usr/local/share/ca-certificates | tr '\n' ' ')"
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp -a /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
fi
mkdir -p "$root/proc" "$root/sys" "$root/dev"
mount -t proc proc "$root/proc"; mounts+=("$root/proc")
mount -t sysfs sysfs "$root/sys"; mounts+=("$root/sys")
bind /dev "$root/dev"
bind /dev/pts "$root/dev/pts"
in_root 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends make >/dev/null && make --version | head -1'
stage_done

# --- 3. a clean clone of the committed tree -------------------------------------
stage "clone $ref (${commit:0:12})"
mkdir -p "$root/work"
git clone --quiet --no-hardlinks "$repo" "$root/work/pdq"
git -C "$root/work/pdq" -c advice.detachedHead=false checkout --quiet --detach "$commit"
git -C "$root/work/pdq" log -1 --format='fresh-box: testing %h %s'
if [ -d "$shared_data" ]; then
  bind "$shared_data" "$root/work/shared/data" ro
  echo "fresh-box: $shared_data mounted read-only at /work/shared/data"
else
  echo "fresh-box: no $shared_data here; WikiText tests will skip"
fi
stage_done

# --- 4. the README's two commands ------------------------------------------------
stage "make test"
if ! in_root 'cd /work/pdq && make test'; then
  failed_what="make test"
  exit 1
fi
stage_done
echo "fresh-box: make test: deps done at +$(when '^\[[^]]*\] deps: (done|all)'), configured at" \
  "+$(when 'Build files have been written'), built at +$(when '^\[[^]]*\] model: '), model at" \
  "+$(when 'model: .*(ready|present)|continuing without the model'), tests from +$(when 'Test project')"
skipped=$(grep -c '(Skipped)' "$stage_log" || true)
echo "fresh-box: make test: $(grep -o '[0-9]*% tests passed.*' "$stage_log" | tail -1)," \
  "$skipped skipped$([ "$skipped" -gt 0 ] && echo ' (listed above)')"

stage "make demo"
if ! in_root 'cd /work/pdq && make demo'; then
  failed_what="make demo"
  exit 1
fi
stage_done

result=PASS
