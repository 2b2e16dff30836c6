#!/usr/bin/env bash
# Registers a SuperNode's public key with the SuperLink of the "deploy" connection. A SuperLink
# that is still starting answers "unavailable": retry until MGFL_REGISTER_TIMEOUT_S (default 120)
# have passed. "Public key already in use" means it is registered: done.
#   FLWR_HOME=DIR register_node.sh KEYS_DIR/node-I.pub
set -uo pipefail
KEY=${1:?usage: register_node.sh NODE_KEY.pub}
deadline=$((SECONDS + ${MGFL_REGISTER_TIMEOUT_S:-120}))
attempt=1
while :; do
    out=$(flwr supernode register "$KEY" deploy 2>&1) && { echo "$out"; exit 0; }
    if grep -q "already in use" <<<"$out"; then echo "$KEY already registered"; exit 0; fi
    if ((SECONDS >= deadline)); then
        echo "$out" >&2
        echo "$KEY: not registered after $attempt attempts" >&2
        exit 1
    fi
    attempt=$((attempt + 1))
    sleep 2
done
