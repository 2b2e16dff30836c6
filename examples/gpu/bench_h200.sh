#!/usr/bin/env bash
# Tuning and side-by-side benchmarks on an NVIDIA GPU through NVIDIA's OpenCL driver
# (docs: ../shared/docs/GPU.md). Run from the repository root on a machine where `.whl/` holds
# pyopencl and the CLI's wheels for its Python and where torch with CUDA is installed; results go
# to $OUT (default ./gpu-results).
set -uo pipefail
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/nvidia-smi.csv"
python3 -c "import torch; print(torch.__version__, torch.cuda.is_available())" > "$OUT/torch.txt" 2>&1
python3 -m mgfl devices --json > "$OUT/devices.json"
python3 -m mgfl tune --budget 120s --json > "$OUT/tune.json" 2> "$OUT/tune.err"
COLUMNS=200 python3 -m mgfl bench --suite all --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
tail -n 40 "$OUT/bench.txt"
