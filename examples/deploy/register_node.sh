#!/usr/bin/env bash
# Registers a SuperNode's public key with the SuperLink of the "deploy" connection. A SuperLink
# that has just started may answer "unavailable": retry a few times ("already in use" = done).
#   FLWR_HOME=DIR register_node.sh KEYS_DIR/node-I.pub
set -uo pipefail
KEY=${1:?usage: register_node.sh NODE_KEY.pub}
for attempt in 1 2 3 4 5; do
    out=$(flwr supernode register "$KEY" deploy 2>&1) && { echo "$out"; exit 0; }
    if grep -q "already in use" <<<"$out"; then echo "$KEY already registered"; exit 0; fi
    echo "attempt $attempt: $out" >&2
    sleep 3
done
exit 1
