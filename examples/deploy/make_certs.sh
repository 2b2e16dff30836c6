#!/usr/bin/env bash
# TLS certificates for a SuperLink (a private CA signs the server certificate), a certificate for
# each SuperNode's local runtime API (127.0.0.1, between the SuperNode and the app processes it
# starts), and one OpenSSH ECDSA P-384 key per SuperNode for node authentication (Flower refuses
# ed25519). The node keys come from Python's `cryptography` (installed with flwr), so no OpenSSH
# client is needed; they are the keys `ssh-keygen -t ecdsa -b 384` writes.
#   make_certs.sh DIR [HOST] [NODES]     e.g. make_certs.sh ./deploy-keys 127.0.0.1 2
set -euo pipefail
DIR=${1:?usage: make_certs.sh DIR [HOST] [NODES]}
HOST=${2:-127.0.0.1}
NODES=${3:-2}
PYTHON=${PYTHON:-python3}
mkdir -p "$DIR"
cd "$DIR"
openssl req -x509 -newkey rsa:3072 -nodes -days 30 -subj "/CN=mgfl deployment CA" \
    -keyout ca.key -out ca.crt 2>/dev/null

# server_certificate NAME CN SAN: NAME.pem and NAME.key, signed by the CA, for TLS servers only.
server_certificate() {
    openssl req -newkey rsa:3072 -nodes -subj "/CN=$2" -keyout "$1.key" -out "$1.csr" 2>/dev/null
    printf "subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n" \
        "$3" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
        -extfile "$1.ext" -out "$1.pem" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
    chmod 600 "$1.key"
}
if [[ $HOST =~ ^[0-9.]+$ ]]; then SAN="IP:$HOST,DNS:localhost"; else SAN="DNS:$HOST,IP:127.0.0.1"; fi
server_certificate server "$HOST" "$SAN"
server_certificate runtime localhost "IP:127.0.0.1,DNS:localhost"
chmod 600 ca.key

"$PYTHON" - "$NODES" <<'PY'
import os
import sys

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

for i in range(int(sys.argv[1])):
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH)
    path = f"node-{i}"
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
        out.write(private)
    with open(path + ".pub", "wb") as out:
        out.write(public + f" mgfl-node-{i}\n".encode())
PY
echo "CA ca.crt; SuperLink certificate server.pem (key server.key); SuperNode runtime API" \
    "certificate runtime.pem (key runtime.key); node keys node-0..node-$((NODES - 1))"
