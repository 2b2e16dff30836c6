#!/usr/bin/env bash
# Writes a flwr connection named "deploy" (TLS, the CA of make_certs.sh) into $FLWR_HOME.
#   FLWR_HOME=DIR connection.sh KEYS_DIR [HOST]
set -euo pipefail
KEYS=$(cd "${1:?usage: connection.sh KEYS_DIR [HOST]}" && pwd)
HOST=${2:-127.0.0.1}
: "${FLWR_HOME:?set FLWR_HOME to the directory of the flwr configuration}"
mkdir -p "$FLWR_HOME"
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "deploy"

[superlink.deploy]
address = "$HOST:${MGFL_SUPERLINK_PORT:-9091}"
root-certificates = "$KEYS/ca.crt"
TOML
