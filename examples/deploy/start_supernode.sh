#!/usr/bin/env bash
# A SuperNode that runs mgfl's ClientApp on this machine's OpenCL device (MGFL_DEVICE chooses it)
# and trains on its share of the data set.
#   start_supernode.sh KEYS_DIR NODE_INDEX NUM_PARTITIONS SUPERLINK_HOST:PORT [RUNTIME_PORT]
set -euo pipefail
KEYS=${1:?usage: start_supernode.sh KEYS_DIR NODE_INDEX NUM_PARTITIONS HOST:PORT [RUNTIME_PORT]}
I=${2:?node index}
N=${3:?number of partitions}
LINK=${4:?superlink address}
PORT=${5:-$((9094 + I))}
exec flower-supernode \
    --superlink "$LINK" \
    --root-certificates "$KEYS/ca.crt" \
    --auth-supernode-private-key "$KEYS/node-$I" \
    --port "$PORT" \
    --node-config "partition-id=$I num-partitions=$N"
