#!/usr/bin/env bash
# Calibrate an H200 machine and fold the measurements into the declared h200 profile.
#
#   bash bench/calibrate_gpu.sh [--quick]          # on the GPU machine, from the repository root
#   bash bench/calibrate_gpu.sh --smoke            # any machine: tiny shapes, gloo, code paths only
#
# Writes into $OUT (default bench/results/calibration):
#   h200-measured.yaml/.summary.md one-GPU curves and constants (python3 -m calibration, GPU 0 only)
#   coll.yaml/.summary.md  collectives at W = all GPUs (torchrun -m calibration.collectives), if W >= 2
#   h200.yaml               planner/profiles/clusters/h200.yaml with both merged in (declared topology kept)
#   calibrate.log           everything printed
# Pydantic wheels, when the machine lacks pydantic, are installed from .whl (see
# ../shared/tools/device-wheels.sh). Exit status: the first failing step's.
set -uo pipefail
OUT=${OUT:-bench/results/calibration}
mkdir -p "$OUT"
exec > >(tee "$OUT/calibrate.log") 2>&1
if ! python3 -c 'import pydantic' 2>/dev/null && [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
smoke=""; for a in "$@"; do [ "$a" = "--smoke" ] && smoke="--smoke"; done
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
nproc=$ngpu; [ -n "$smoke" ] && nproc=2
rc=0
echo "== one-GPU calibration ($ngpu GPU(s) on the machine) =="
time CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} python3 -m calibration --no-progress \
  --out "$OUT/h200-measured.yaml" "$@" || rc=$?
measured=("$OUT/h200-measured.yaml")
if [ "$nproc" -ge 2 ]; then
  echo "== collectives at W=$nproc =="
  time torchrun --nproc_per_node="$nproc" -m calibration.collectives $smoke --out "$OUT/coll.yaml" || { r=$?; [ $rc -eq 0 ] && rc=$r; }
  [ -f "$OUT/coll.yaml" ] && measured+=("$OUT/coll.yaml")
fi
if [ -z "$smoke" ] && [ -f "$OUT/h200-measured.yaml" ]; then
  echo "== merge into the declared profile =="
  python3 -m calibration.merge planner/profiles/clusters/h200.yaml "${measured[@]}" --out "$OUT/h200.yaml" || { r=$?; [ $rc -eq 0 ] && rc=$r; }
fi
exit $rc
