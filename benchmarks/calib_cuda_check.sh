#!/usr/bin/env bash
# Calibration on a CUDA GPU (quant/calib/device.py), checked and timed in one run:
#   1. tests/quant_calib/test_calib_device.py: GPTQ, P-GPTQ and AWQ codes on the GPU against the
#      CPU's on the demo and a tiny Llama (the agreement figures are printed)
#   2. benchmarks/calib_cuda.py: GPTQ (marlin's recipe) on a real-width MiniCPM4.1-8B fixture of
#      $LAYERS blocks at $SAMPLES x $SEQ_LEN tokens, seconds per block and peak GPU memory
# Logs and results go to $OUT (default: ./calib-cuda-check). Run from the repository root on a
# machine with a CUDA GPU and torch built for CUDA:
#     bash benchmarks/calib_cuda_check.sh
# The package is installed editable without dependencies (the machine may be offline): torch,
# numpy, safetensors, tokenizers, jinja2, typer, rich, psutil and pytest must already be there.
set -u -o pipefail
OUT=${OUT:-calib-cuda-check}
LAYERS=${LAYERS:-4}
SAMPLES=${SAMPLES:-128}
SEQ_LEN=${SEQ_LEN:-2048}
mkdir -p "$OUT"
PY=${PY:-python3}
status=0
step() { echo; echo "== $1"; }

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/device.txt"
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee -a "$OUT/device.txt"
nproc | tee -a "$OUT/device.txt"

step "install (editable, no dependencies)"
$PY -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || {
    cat "$OUT/install.log"; exit 1; }

step "CPU / GPU agreement tests"
$PY -m pytest -q -s -p no:cacheprovider tests/quant_calib/test_calib_device.py 2>&1 \
    | tee "$OUT/agreement.log" | grep -E "^(demo|tiny-llama) |passed|failed|Error|error" || status=1

step "8B-shaped calibration on the GPU ($LAYERS blocks, $SAMPLES x $SEQ_LEN tokens)"
$PY benchmarks/calib_cuda.py --layers "$LAYERS" --samples "$SAMPLES" --seq-len "$SEQ_LEN" \
    --fixtures "${FIXTURES:-/tmp/arkinfer-fixtures}" --work /tmp/calib-cuda.work \
    --json "$OUT/calib_cuda.json" > "$OUT/calib_cuda.log" 2>&1 || status=1
grep -E "^block|Error|error" "$OUT/calib_cuda.log" | tail -20
tail -c 1500 "$OUT/calib_cuda.json" 2>/dev/null
exit $status
