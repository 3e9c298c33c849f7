#!/usr/bin/env bash
# Device run on one H200: the dispatch-kernel microbenchmark, the host AdamW/cast tables and the
# offload bench on the same machine instance (host-CPU rates compare only within one instance).
set -u
R=$OUT/r; mkdir -p "$R"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
timeout 130 python3 -m calibration.dispatch_kernels --out "$R" > "$R/dispatch_kernels.log" 2>&1; echo "dk rc=$?"
tar czf "$OUT/run4.tgz" -C "$R" .
timeout 40 python3 -m calibration --sections cpu_adamw,cpu_cast --out "$R/cpu_host.yaml" --no-progress > "$R/cpu_host.log" 2>&1; echo "cpu rc=$?"
tar czf "$OUT/run4.tgz" -C "$R" .
timeout 150 python3 bench/offload.py --race --out "$R" > "$R/offload.log" 2>&1; echo "offload rc=$?"
tar czf "$OUT/run4.tgz" -C "$R" .
ls -la "$R"
