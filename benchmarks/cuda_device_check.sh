#!/usr/bin/env bash
# The CUDA kernels (backends/tensorrt/kernels) checked and timed on a CUDA GPU, in one run:
#   1. the GPU tests (W4A16 vs the numpy Marlin unpack; InfLLM v2 vs the reference)
#   2. the InfLLM v2 conformance suite with the `cuda` implementation
#   3. compute-sanitizer memcheck over the small GPU tests (where compute-sanitizer exists)
#   4. benchmarks/cuda_kernels.py (results JSON)
# Logs and the results JSON go to $OUT (default: ./cuda-check). Run from the repository root on
# a machine with a CUDA GPU, nvcc and torch built for CUDA:
#     bash benchmarks/cuda_device_check.sh
# The package is installed editable without dependencies (the machine may be offline): torch,
# numpy, safetensors, tokenizers, jinja2, typer, rich, psutil and pytest must already be there.
set -u -o pipefail
OUT=${OUT:-cuda-check}
mkdir -p "$OUT"
PY=${PY:-python3}
status=0
step() { echo; echo "== $1"; }

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/device.txt"
nvcc --version | tail -2 | tee -a "$OUT/device.txt"
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee -a "$OUT/device.txt"

step "install (editable, no dependencies)"
$PY -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || {
    cat "$OUT/install.log"; exit 1; }
$PY -c "from arkinfer.backends.tensorrt.kernels.build import library_path; print(library_path())" \
    2>&1 | tee "$OUT/build.log" || status=1

step "GPU tests"
$PY -m pytest -q -p no:cacheprovider tests/backends/tensorrt/test_cuda_kernels_gpu.py \
    tests/backends/tensorrt/test_cuda_kernels_build.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -15 || status=1

step "conformance suite, cuda implementation"
$PY -m pytest -q -p no:cacheprovider -m "not heavy" tests/conformance -k cuda 2>&1 \
    | tee "$OUT/conformance.log" | tail -8 || status=1

step "compute-sanitizer memcheck (small tests)"
if command -v compute-sanitizer > /dev/null; then
    compute-sanitizer --tool memcheck --error-exitcode 3 $PY -m pytest -q -p no:cacheprovider \
        tests/backends/tensorrt/test_cuda_kernels_gpu.py -k "needle or adapter or (small and 4099) or (marlin and 512)" \
        2>&1 | tee "$OUT/memcheck.log" | grep -E "ERROR SUMMARY|passed|failed" || status=1
else
    echo "compute-sanitizer not found: skipped" | tee "$OUT/memcheck.log"
fi

step "benchmark"
$PY benchmarks/cuda_kernels.py --out "$OUT/cuda_kernels.json" 2>&1 | tee "$OUT/bench.log" \
    | tail -25 || status=1
exit $status
