#!/usr/bin/env bash
# A SuperLink over TLS that only admits registered SuperNodes, and that never installs packages
# at run time (fleet, control and runtime APIs share one HTTPS port; the apps run from the installed mgfl; the machine may be offline).
#   start_superlink.sh KEYS_DIR STATE_DIR [HOST]
set -euo pipefail
KEYS=${1:?usage: start_superlink.sh KEYS_DIR STATE_DIR [HOST]}
STATE=${2:?usage: start_superlink.sh KEYS_DIR STATE_DIR [HOST]}
HOST=${3:-127.0.0.1}
mkdir -p "$STATE"
exec flower-superlink \
    --ssl-ca-certfile "$KEYS/ca.crt" --ssl-certfile "$KEYS/server.pem" \
    --ssl-keyfile "$KEYS/server.key" \
    --enable-supernode-auth \
    --disable-runtime-dependency-installation \
    --host "$HOST" --port "${MGFL_SUPERLINK_PORT:-9091}" \
    --database "$STATE/superlink.db"
