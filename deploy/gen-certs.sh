#!/usr/bin/env bash
# Makes a test certificate authority and certificates for quorumq's TLS (AMQPS on 5671,
# TLS on the cluster port), with openssl. For tests and trials: production certificates
# come from your own CA. Private keys are written only to OUT_DIR (default
# deploy/certs/, git-ignored); none is committed.
#
#   deploy/gen-certs.sh [OUT_DIR] [--host NAME_OR_IP]... [--client USER]...
#
# OUT_DIR gets:
#   ca.pem, ca.key          the test CA (EC P-256, 10 years)
#   node.pem, node.key      a node certificate for every --host (and localhost,
#                           127.0.0.1): serverAuth + clientAuth, so one file serves
#                           AMQPS, the cluster port and the node's calls to its peers
#   client-USER.pem/.key    a client certificate with CN=USER for every --client
#                           (default: guest), for the EXTERNAL mechanism
# Node config: tls_cert_file = node.pem, tls_key_file = node.key, tls_ca_file = ca.pem.
set -euo pipefail

out="deploy/certs"
hosts=()
clients=()
while [ $# -gt 0 ]; do
  case "$1" in
    --host) hosts+=("$2"); shift 2 ;;
    --client) clients+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) out="$1"; shift ;;
  esac
done
[ ${#clients[@]} -gt 0 ] || clients=(guest)
command -v openssl >/dev/null || { echo "gen-certs.sh needs openssl" >&2; exit 1; }
mkdir -p "$out"
umask 077

newkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

if [ ! -f "$out/ca.pem" ]; then
  newkey "$out/ca.key"
  openssl req -x509 -new -key "$out/ca.key" -sha256 -days 3650 \
    -subj "/CN=quorumq test CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$out/ca.pem"
fi

# sign NAME SUBJECT EXTFILE: NAME.key, NAME.pem signed by the CA.
sign() {
  newkey "$out/$1.key"
  openssl req -new -key "$out/$1.key" -subj "$2" -out "$out/$1.csr"
  openssl x509 -req -in "$out/$1.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" \
    -CAcreateserial -days 825 -sha256 -extfile "$3" -out "$out/$1.pem" 2>/dev/null
  rm -f "$out/$1.csr"
}

san="DNS:localhost,IP:127.0.0.1"
for h in "${hosts[@]+"${hosts[@]}"}"; do
  if [[ "$h" =~ ^[0-9.]+$ || "$h" == *:* ]]; then san="$san,IP:$h"; else san="$san,DNS:$h"; fi
done
ext="$out/.ext"
cat > "$ext" <<EOF
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$san
EOF
sign node "/CN=quorumq node" "$ext"

for c in "${clients[@]}"; do
  cat > "$ext" <<EOF
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
EOF
  sign "client-$c" "/CN=$c" "$ext"
done
rm -f "$ext" "$out/ca.srl"
chmod 0644 "$out"/*.pem
echo "certificates in $out: ca.pem, node.pem (SAN $san), ${clients[*]/#/client-}"
