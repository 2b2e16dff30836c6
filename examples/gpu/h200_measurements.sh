#!/usr/bin/env bash
# Engine measurements on an NVIDIA GPU through NVIDIA's OpenCL driver (see docs/gpu.md).
# Run from the repository root on a machine where `.whl/` holds pyopencl and the CLI's wheels for
# its Python; results go to $OUT (default ./gpu-results).
set -uo pipefail
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/nvidia-smi.csv"
python3 -m mgfl devices --json > "$OUT/devices.json"
python3 -m pytest -q -p no:cacheprovider tests/kernels tests/client_runtime/test_step.py \
  --ignore tests/kernels/test_oclgrind.py 2>&1 | tail -3 > "$OUT/tests.txt"
train() { local tag=$1; shift; python3 -m mgfl train "$@" --json "$OUT/$tag.json" > "$OUT/$tag.txt" 2>&1; }
train mlp_b32 --model mlp --data synthetic --batch 32 --steps 400
train lenet5_b64 --model lenet5 --data synthetic --batch 64 --steps 400
train dscnn_b64 --model dscnn --data synthetic --batch 64 --steps 200
train mobilenetv2_b32 --model mobilenetv2 --data synthetic --batch 32 --steps 100
train dscnn_fsdd_adam --model dscnn --data fsdd --batch 32 --epochs 20 --optimizer adam --lr 0.001
train dscnn_fsdd_sgd --model dscnn --data fsdd --batch 32 --epochs 20 --lr 0.05
tail -n 2 "$OUT"/*.txt
