#!/usr/bin/env bash
# Makes what pdq's mutual TLS needs: a CA, one certificate the router and
# the workers share (they all present it; the CA is what makes it trusted),
# and a file of API keys for clients.
#
#   scripts/make_certs.sh DIR [NAME...]
#
# DIR gets ca.pem, ca-key.pem (keep it elsewhere once done), pdq.pem,
# pdq-key.pem and api-keys.txt (one fresh key). The certificate names
# localhost, 127.0.0.1, pdq-router, pdq-worker and each NAME (a DNS name, or
# an IP address), valid for 825 days. On Kubernetes the router is reached as
# pdq-router, and it checks workers as pdq-worker (--worker-tls-name):
#   kubectl create secret generic pdq-tls --from-file=DIR/ca.pem \
#     --from-file=DIR/pdq.pem --from-file=DIR/pdq-key.pem
#   kubectl create secret generic pdq-api-keys --from-file=DIR/api-keys.txt
set -euo pipefail

if [ $# -lt 1 ] || [ "$1" = "--help" ] || [ "$1" = "-h" ]; then
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
  [ $# -lt 1 ] && exit 2 || exit 0
fi
command -v openssl >/dev/null || { echo "make_certs: openssl is not installed (scripts/install_deps.sh)" >&2; exit 1; }
dir=$1
shift
mkdir -p "$dir"
umask 077

san="DNS:localhost,IP:127.0.0.1,DNS:pdq-router,DNS:pdq-worker"
for name in "$@"; do
  if [[ $name =~ ^[0-9.]+$ || $name == *:* ]]; then san+=",IP:$name"; else san+=",DNS:$name"; fi
done

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 825 \
  -subj "/CN=pdq CA" -keyout "$dir/ca-key.pem" -out "$dir/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -subj "/CN=pdq" -keyout "$dir/pdq-key.pem" -out "$dir/pdq.csr" 2>/dev/null
openssl x509 -req -in "$dir/pdq.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" \
  -CAcreateserial -days 825 -out "$dir/pdq.pem" \
  -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san") 2>/dev/null
rm -f "$dir/pdq.csr" "$dir/ca.srl"
echo "# pdq API keys: one per line; clients send one as 'authorization: Bearer KEY'" > "$dir/api-keys.txt"
openssl rand -hex 24 >> "$dir/api-keys.txt"
chmod 644 "$dir/ca.pem" "$dir/pdq.pem"
echo "make_certs: $dir/{ca.pem,pdq.pem,pdq-key.pem,api-keys.txt} for $san"
