#!/usr/bin/env bash
# The codec comparison of examples/simulation/compare_codecs.py on Flower's deployment runtime,
# which needs no Ray: one whole local federation per codec (local_federation.py: TLS, node keys,
# SuperLink, SuperNodes, flwr run), all of them at once, each on its own ports; then the table of
# `compare_codecs.py --summarize` and its plot.
#   compare_codecs_deployed.sh OUT "RUN_CONFIG" CODEC...
#   e.g. compare_codecs_deployed.sh /abs/runs/codecs "num-rounds=20" none fp16 int8 topk:0.01
#
# Writes OUT/<codec>.json (each run's history, ':' in a codec name becoming '-'), OUT/<codec>.log
# (its progress), OUT/<codec>/ (its checkpoints) and OUT/codecs.png. RUN_CONFIG is added to every
# run; it must not set codec or output-dir. Environment: PYTHON (python3), MGFL_NODES (6: one
# SuperNode per FSDD speaker), MGFL_PORT_BASE (19100: federation k listens on the NODES+1 ports
# from BASE + k*(NODES+1)), MGFL_RUN_TIMEOUT_S (3600: a run still going then is stopped, and the
# rounds it finished are compared), MGFL_AT_ROUND (compare the runs at this round, default each
# run's last), MGFL_DEVICE (the OpenCL device of the clients and of the server's evaluation).
# Exits non-zero if any run did not finish all its rounds.
set -uo pipefail
OUT=${1:?usage: compare_codecs_deployed.sh OUT "RUN_CONFIG" CODEC...}
COMMON=${2?usage: compare_codecs_deployed.sh OUT "RUN_CONFIG" CODEC...}
shift 2
(($# > 0)) || { echo "name at least one codec" >&2; exit 2; }
PYTHON=${PYTHON:-python3}
NODES=${MGFL_NODES:-6}
BASE=${MGFL_PORT_BASE:-19100}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

pids=()
k=0
start=$SECONDS
for codec in "$@"; do
    name=${codec//:/-}
    "$PYTHON" "$HERE/local_federation.py" --label "$codec" --nodes "$NODES" \
        --port-base $((BASE + k * (NODES + 1))) --timeout "${MGFL_RUN_TIMEOUT_S:-3600}" \
        --output-dir "$OUT/$name" --run-config "$COMMON codec='$codec'" 2>&1 \
        | tee "$OUT/$name.log" &
    pids+=($!)
    k=$((k + 1))
done

failed=()
for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || failed+=("${@:$((i + 1)):1}")
done
echo "all federations ended after $((SECONDS - start)) s"

for codec in "$@"; do
    name=${codec//:/-}
    if [[ -f $OUT/$name/history.json ]]; then
        cp "$OUT/$name/history.json" "$OUT/$name.json"
    else
        rm -f "$OUT/$name.json"
    fi
done

"$PYTHON" - "$HERE/../simulation" "$OUT" "${MGFL_AT_ROUND:-}" "$@" <<'PY'
import json
import sys
from pathlib import Path

simulation, out, at_round, codecs = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4:]
sys.path.insert(0, simulation)
from compare_codecs import file_name, plot_comparison, summarize  # noqa: E402

histories = {}
for codec in codecs:
    path = out / f"{file_name(codec)}.json"
    history = json.loads(path.read_text()) if path.exists() else {"rounds": []}
    if any(r["round"] > 0 and r["clients"] for r in history["rounds"]):
        histories[codec] = history
    else:
        print(f"{codec}: no trained round")
if histories:
    print(summarize(histories, int(at_round) if at_round else None))
    print("plot:", plot_comparison(histories, out / "codecs.png"))
PY

if ((${#failed[@]})); then
    echo "incomplete runs: ${failed[*]} (their logs: $OUT/<codec>.log)" >&2
    exit 1
fi
