#!/usr/bin/env bash
# TLS certificates for a SuperLink (a private CA signs the server certificate), and one OpenSSH
# ECDSA P-384 key per SuperNode for node authentication (Flower refuses ed25519).
#   make_certs.sh DIR [HOST] [NODES]     e.g. make_certs.sh ./deploy-keys 127.0.0.1 2
set -euo pipefail
DIR=${1:?usage: make_certs.sh DIR [HOST] [NODES]}
HOST=${2:-127.0.0.1}
NODES=${3:-2}
mkdir -p "$DIR"
cd "$DIR"
openssl req -x509 -newkey rsa:3072 -nodes -days 30 -subj "/CN=mgfl deployment CA" \
    -keyout ca.key -out ca.crt 2>/dev/null
openssl req -newkey rsa:3072 -nodes -subj "/CN=$HOST" -keyout server.key -out server.csr \
    2>/dev/null
if [[ $HOST =~ ^[0-9.]+$ ]]; then SAN="IP:$HOST,DNS:localhost"; else SAN="DNS:$HOST,IP:127.0.0.1"; fi
printf "subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n" "$SAN" > server.ext
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
    -extfile server.ext -out server.pem 2>/dev/null
chmod 600 ca.key server.key
for ((i = 0; i < NODES; i++)); do
    rm -f "node-$i" "node-$i.pub"
    ssh-keygen -q -t ecdsa -b 384 -N "" -C "mgfl-node-$i" -f "node-$i"
done
echo "CA ca.crt, server certificate server.pem (key server.key), node keys node-0..node-$((NODES - 1))"
