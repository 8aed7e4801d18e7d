# shellcheck shell=bash
# Shared by scripts/fresh_box_check.sh and scripts/container_check.sh, which
# debootstrap Debian 12 from the mirror this machine's apt already uses.
# Source it; it defines host_uri_for.

# First URI of an enabled `deb` entry for SUITE in apt's sources (deb822
# .sources files and one-line .list files).
host_uri_for() {
  local want=$1 f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri=$(awk -v want="$want" '
      BEGIN { RS = ""; FS = "\n" }
      {
        types = ""; uris = ""; suites = ""; enabled = 1
        for (i = 1; i <= NF; i++) {
          line = $i
          if (line ~ /^[ \t]*#/) continue
          if (match(line, /^[A-Za-z-]+:/)) {
            key = tolower(substr(line, 1, RLENGTH - 1)); val = substr(line, RLENGTH + 1)
            gsub(/^[ \t]+|[ \t]+$/, "", val)
            if (key == "types") types = val
            else if (key == "uris") uris = val
            else if (key == "suites") suites = val
            else if (key == "enabled" && tolower(val) == "no") enabled = 0
          }
        }
        if (!enabled || (" " types " ") !~ / deb /) next
        n = split(suites, s, /[ \t]+/)
        for (j = 1; j <= n; j++) if (s[j] == want) { split(uris, u, /[ \t]+/); print u[1]; exit }
      }' "$f")
    if [ -n "$uri" ]; then echo "$uri"; return; fi
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    uri=$(awk -v want="$want" '
      $1 == "deb" {
        i = 2
        if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
        if ($(i + 1) == want) { print $i; exit }
      }' "$f")
    if [ -n "$uri" ]; then echo "$uri"; return; fi
  done
}
