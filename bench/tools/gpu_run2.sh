#!/usr/bin/env bash
# Device run on one H200: vocabulary bench, then offload bench, then the fp32 GEMM table, with the
# trace and runtime tests on the device's torch (CPU) alongside. Everything lands in $OUT/run2.tgz.
set -u
R=$OUT/r; mkdir -p "$R"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
nvidia-smi --query-gpu=index,name,memory.used --format=csv > "$R/nvidia-smi.txt"
(CUDA_VISIBLE_DEVICES= timeout 400 python3 -m pytest tests/trace tests/runtime -q -p no:cacheprovider > "$R/tests_torch211.log" 2>&1; echo "tests rc=$?") &
timeout 270 python3 bench/vocab.py --iters 2 --out "$R" > "$R/vocab.log" 2>&1; echo "vocab rc=$?"
tar czf "$OUT/run2.tgz" -C "$R" .
timeout 230 python3 bench/offload.py --race --out "$R" > "$R/offload.log" 2>&1; echo "offload rc=$?"
tar czf "$OUT/run2.tgz" -C "$R" .
timeout 40 python3 -m calibration.compute --fp32-gemm --out "$R/gemm_fp32.yaml" > "$R/fp32.log" 2>&1; echo "fp32 rc=$?"
wait
tar czf "$OUT/run2.tgz" -C "$R" .
ls -la "$R"
