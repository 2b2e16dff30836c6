# Sourced by the scripts beside it on a machine with an NVIDIA GPU and no package index: installs
# the wheels in .whl/ (pyopencl and the CLI's needs, see docs/gpu.md) into /tmp/site, makes NVIDIA's
# OpenCL driver the only platform listed, and selects it for mgfl.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/icd
lib=$(ls /usr/local/nvidia/lib64/libnvidia-opencl.so.1 2>/dev/null || find / -name 'libnvidia-opencl.so.1' 2>/dev/null | head -1)
echo "$lib" > /tmp/icd/nvidia.icd
export OCL_ICD_VENDORS=/tmp/icd MGFL_DEVICE=gpu MGFL_CACHE_DIR=/tmp/mgfl-cache
