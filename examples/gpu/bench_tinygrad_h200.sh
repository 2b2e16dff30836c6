#!/usr/bin/env bash
# The step suite (training steps of the paper MLP, LeNet-5, DS-CNN, MobileNetV2-0.35) with mgfl
# against PyTorch CUDA eager and against tinygrad on the same NVIDIA OpenCL device, in one run
# (docs: ../shared/docs/GPU.md). Run from the repository root; results go to $OUT
# (default ./gpu-results).
#
# Beforehand, on a machine that reaches a package index, put the wheels into .whl/ (git ignores
# it; take it along with the working tree):
#   ../shared/device/fetch-wheels.sh                     # pyopencl and the CLI's needs
#   pip download tinygrad==0.14.0 --no-deps -d .whl     # tinygrad is pure Python
# torch with CUDA must already be installed on the GPU machine.
#
# tinygrad runs in a child process on the device mgfl opened (MGFL_DEVICE=gpu): it is pointed at
# the same OpenCL loader and device handle, and the row's notes name the device. It compiles its
# kernels on first use; --tinygrad-budget bounds that per model (a model over budget gets a note).
set -uo pipefail
OUT=${OUT:-gpu-results}
BUDGET=${BUDGET:-120}
REPEATS=${REPEATS:-20}
mkdir -p "$OUT"
if ! ls .whl/tinygrad-0.14.0-*.whl > /dev/null 2>&1; then
    echo "no tinygrad wheel in .whl/: run 'pip download tinygrad==0.14.0 --no-deps -d .whl' first" >&2
    exit 1
fi
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/nvidia-smi.csv"
python3 -c "import tinygrad, torch; from importlib.metadata import version; \
print('tinygrad', version('tinygrad'), 'torch', torch.__version__, torch.cuda.is_available())" \
    > "$OUT/versions.txt" 2>&1
python3 -m mgfl devices --json > "$OUT/devices.json"
COLUMNS=200 python3 -m mgfl bench --suite step --repeats "$REPEATS" --tinygrad-budget "$BUDGET" \
    --json "$OUT/step-tinygrad.json" > "$OUT/step-tinygrad.txt" 2>&1
tail -n 40 "$OUT/step-tinygrad.txt"
