#!/usr/bin/env bash
# A SuperNode that runs mgfl's ClientApp on this machine's OpenCL device (MGFL_DEVICE chooses it)
# and trains on its share of the data set. Every connection is TLS: to the SuperLink (checked
# against the deployment CA, authenticated with the node's ECDSA key) and the node's own runtime
# API on 127.0.0.1 (runtime.pem), which the ClientApp processes it starts connect to.
#   start_supernode.sh KEYS_DIR NODE_INDEX NUM_PARTITIONS SUPERLINK_HOST:PORT [RUNTIME_PORT]
#
# A node that stopped without signing off (killed, lost its network) stays "online" at the
# SuperLink for two heartbeat intervals (60 s); a restart within that window is refused ("could
# not be activated", exit 305), as is a key that is not registered yet. So a refused start is
# retried: MGFL_SUPERNODE_ATTEMPTS times (default 4), MGFL_SUPERNODE_RETRY_S apart (default 30).
set -uo pipefail
KEYS=${1:?usage: start_supernode.sh KEYS_DIR NODE_INDEX NUM_PARTITIONS HOST:PORT [RUNTIME_PORT]}
I=${2:?node index}
N=${3:?number of partitions}
LINK=${4:?superlink address}
PORT=${5:-$((9094 + I))}
ATTEMPTS=${MGFL_SUPERNODE_ATTEMPTS:-4}
node=0
trap 'if ((node)); then kill -TERM "$node" 2>/dev/null; wait "$node"; fi; exit 143' TERM INT
for ((attempt = 1; attempt <= ATTEMPTS; attempt++)); do
    flower-supernode \
        --superlink "$LINK" \
        --root-certificates "$KEYS/ca.crt" \
        --auth-supernode-private-key "$KEYS/node-$I" \
        --host 127.0.0.1 --port "$PORT" \
        --ssl-certfile "$KEYS/runtime.pem" --ssl-keyfile "$KEYS/runtime.key" \
        --ssl-ca-certfile "$KEYS/ca.crt" \
        --node-config "partition-id=$I num-partitions=$N" &
    node=$!
    wait "$node"
    status=$?
    node=0
    ((status == 0)) && exit 0
    echo "SuperNode $I: attempt $attempt of $ATTEMPTS ended with status $status" >&2
    ((attempt < ATTEMPTS)) && sleep "${MGFL_SUPERNODE_RETRY_S:-30}"
done
exit 1
