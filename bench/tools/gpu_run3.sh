#!/usr/bin/env bash
# Device run on one H200: the dispatch bench (shape A, then shape B, one process each), then the
# host-cast and PipelinedLLEP chunk-count calibration sections; the dispatch trace tests on the
# device's torch (CPU) alongside. Everything lands in $OUT/run3.tgz.
set -u
R=$OUT/r; mkdir -p "$R/A" "$R/B"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
(CUDA_VISIBLE_DEVICES= timeout 400 python3 -m pytest tests/trace/test_dispatch_trace.py -q -p no:cacheprovider > "$R/tests_dispatch_torch211.log" 2>&1; echo "tests rc=$?") &
timeout 230 python3 bench/dispatch.py --shapes A --out "$R/A" > "$R/dispatch_A.log" 2>&1; echo "A rc=$?"
tar czf "$OUT/run3.tgz" -C "$R" .
timeout 150 python3 bench/dispatch.py --shapes B --out "$R/B" > "$R/dispatch_B.log" 2>&1; echo "B rc=$?"
tar czf "$OUT/run3.tgz" -C "$R" .
timeout 100 python3 -m calibration --sections cpu_cast,chunk_count --out "$R/cal_part.yaml" --no-progress > "$R/cal_part.log" 2>&1; echo "cal rc=$?"
wait
tar czf "$OUT/run3.tgz" -C "$R" .
ls -la "$R" "$R/A" "$R/B"
