#!/usr/bin/env bash
# One pass of every H200 figure in BENCHMARKS.md within a 10-minute machine lease: the engine's
# kernel and step tests on the GPU, a short tuning run, `mgfl bench --suite all` (against cuBLAS,
# PyTorch CUDA eager and tinygrad on the same OpenCL device), and `mgfl train` step figures.
# Run from the repository root with `.whl/` holding pyopencl, the CLI's wheels and tinygrad
# (docs: ../shared/docs/GPU.md); everything lands in $OUT/h200.tar.gz.
set -uo pipefail
OUT=${OUT:-gpu-results}
WORK=$OUT/h200
mkdir -p "$WORK"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$WORK/nvidia-smi.csv"
python3 -m mgfl devices --json > "$WORK/devices.json"
stage() { echo "== $1 $(date +%T)" | tee -a "$WORK/stages.txt"; }
stage tests
timeout "${TEST_S:-150}" python3 -m pytest -q -x -p no:cacheprovider tests/client_runtime/test_step.py \
    tests/kernels/test_gemm.py > "$WORK/tests.txt" 2>&1; echo "tests rc=$?" >> "$WORK/stages.txt"
tail -n 3 "$WORK/tests.txt"
stage tune
python3 -m mgfl tune --budget "${TUNE:-45s}" --json > "$WORK/tune.json" 2> "$WORK/tune.err"
stage bench
COLUMNS=200 timeout "${BENCH_S:-330}" python3 -m mgfl bench --suite all --repeats 20 \
    --tinygrad-budget "${TINYGRAD_S:-60}" --json "$WORK/bench.json" > "$WORK/bench.txt" 2>&1
echo "bench rc=$?" >> "$WORK/stages.txt"
tail -n 45 "$WORK/bench.txt"
stage train
train() { local tag=$1; shift; timeout 60 python3 -m mgfl train "$@" --json "$WORK/$tag.json" > "$WORK/$tag.txt" 2>&1; }
train mlp_b32 --model mlp --data synthetic --batch 32 --steps 300
train lenet5_b64 --model lenet5 --data synthetic --batch 64 --steps 300
train dscnn_b64 --model dscnn --data synthetic --batch 64 --steps 200
train mobilenetv2_b32 --model mobilenetv2 --data synthetic --batch 32 --steps 60
stage done
tail -n 4 "$WORK"/*_b*.txt
tar -czf "$OUT/h200.tar.gz" -C "$OUT" h200
