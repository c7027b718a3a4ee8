#!/usr/bin/env bash
# Make a private certificate authority and the certificates a secured meshmq network
# uses, with openssl only (docs/security.md walks through them):
#
#   ca.pem / ca.key             the authority every broker and client trusts
#   broker-<name>.pem / .key    one per broker: a server certificate (valid for the
#                               host names given) that is also its client certificate
#                               on broker links and replication links
#   client-<name>.pem / .key    one per client user (certificate authentication)
#
# Usage: make-certs.sh DIR [--days N] [--host NAME]... [--broker NAME]... [--client NAME]...
# Defaults: 365 days, hosts localhost and 127.0.0.1, brokers "a" and "b", client "app".
# A file that already exists is kept, so the script can add certificates to an
# existing authority. Subjects read "CN=<name>, OU=<brokers|clients>, O=meshmq".
set -euo pipefail

usage() { echo "usage: $0 DIR [--days N] [--host NAME]... [--broker NAME]... [--client NAME]..." >&2; exit 2; }
[ $# -ge 1 ] || usage
dir=$1; shift
days=365; hosts=(); brokers=(); clients=()
while [ $# -gt 0 ]; do
    case $1 in
        --days) days=${2:?}; shift 2 ;;
        --host) hosts+=("${2:?}"); shift 2 ;;
        --broker) brokers+=("${2:?}"); shift 2 ;;
        --client) clients+=("${2:?}"); shift 2 ;;
        *) usage ;;
    esac
done
[ ${#hosts[@]} -gt 0 ] || hosts=(localhost 127.0.0.1)
[ ${#brokers[@]} -gt 0 ] || brokers=(a b)
[ ${#clients[@]} -gt 0 ] || clients=(app)
command -v openssl >/dev/null || { echo "openssl is not installed (Debian: apt-get install openssl)" >&2; exit 1; }

mkdir -p "$dir"
cd "$dir"
umask 077

if [ ! -f ca.pem ]; then
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$days" \
        -keyout ca.key -out ca.pem -subj "/O=meshmq/OU=authority/CN=meshmq test CA" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi

san=""
for h in "${hosts[@]}"; do
    if [[ $h =~ ^[0-9.]+$ || $h == *:* ]]; then san+="IP:$h,"; else san+="DNS:$h,"; fi
done
san=${san%,}

# issue NAME OU EXTENSIONS: a key and a certificate signed by the authority.
issue() {
    local name=$1 ou=$2 ext=$3
    [ -f "$name.pem" ] && return 0
    openssl req -newkey rsa:2048 -nodes -sha256 -keyout "$name.key" -out "$name.csr" \
        -subj "/O=meshmq/OU=$ou/CN=${name#*-}" 2>/dev/null
    printf '%s\n' "$ext" > "$name.ext"
    openssl x509 -req -sha256 -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \
        -days "$days" -out "$name.pem" -extfile "$name.ext" 2>/dev/null
    rm -f "$name.csr" "$name.ext"
}

for b in "${brokers[@]}"; do
    issue "broker-$b" brokers "subjectAltName=$san
extendedKeyUsage=serverAuth,clientAuth"
done
for c in "${clients[@]}"; do
    issue "client-$c" clients "extendedKeyUsage=clientAuth"
done
chmod 644 ./*.pem
echo "certificates in $PWD: ca.pem$(printf ' broker-%s.pem' "${brokers[@]}")$(printf ' client-%s.pem' "${clients[@]}")"
