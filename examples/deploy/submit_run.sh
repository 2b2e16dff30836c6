#!/usr/bin/env bash
# Submits mgfl's apps to the "deploy" federation and streams the server's log.
#   FLWR_HOME=DIR submit_run.sh PROJECT_DIR "RUN_CONFIG"
#   e.g. submit_run.sh /path/to/mgfl "num-rounds=2 partition='iid' num-clients=2 output-dir='/abs/run'"
set -euo pipefail
exec flwr run "${1:?usage: submit_run.sh PROJECT_DIR RUN_CONFIG}" deploy --stream \
    --run-config "${2:-}"
