#!/usr/bin/env bash
# The dispatch benches and the calibration sections they are predicted from, on one host instance.
#
#   bash bench/dispatch_same_instance.sh OUT [--smoke]
#
# In this order on one machine: the `planner calibrate` sections the dispatch model reads
# (chunk_count, dispatch_kernels, memory_sizes: a partial profile), the dispatch kernels at every
# shipped width (bench/calibrate_coverage.py --sections dispatch_widths), then bench/dispatch.py at
# shapes B and A with filled receive buffers. tests/unit/test_heldout_dispatch_instance.py predicts
# the bench rows with the GPU's shipped profile and these curves merged in (README: the time model).
# Each step has its own time limit; a step that fails or runs out is logged and the next one runs.
set -uo pipefail
out=${1:?usage: bash bench/dispatch_same_instance.sh OUT [--smoke]}
smoke=${2:-}
cd "$(dirname "$0")/.."
mkdir -p "$out"
log="$out/run.log"
iters=5   # timed calls per bench row, their median (runs h100_d0b286e2 and h100_00c2e474 used dispatch.py's 2)
if [ "$smoke" = "--smoke" ]; then cal=--smoke; cov=--dry-run; dis=--smoke; else cal=; cov=; dis=; fi

step() {  # step LIMIT_S NAME CMD...
    local limit=$1 name=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" >> "$log" 2>&1
    local rc=$?
    echo "[$name] rc=$rc in $((SECONDS - t0)) s" | tee -a "$log"
}

step 150 calibrate python3 -m calibration $cal --no-progress --out "$out/measured.yaml" \
    --sections chunk_count,dispatch_kernels,memory_sizes
step 150 dispatch_widths python3 bench/calibrate_coverage.py $cov --out "$out/cov" --sections dispatch_widths
step 220 dispatch_B python3 bench/dispatch.py $dis --shapes B --ops ep llep pipelined_llep \
    --binding-only ep llep pipelined_llep --no-trace --fill --iters "$iters" --out "$out"
step 260 dispatch_A python3 bench/dispatch.py $dis --shapes A --ops ep llep pipelined_llep \
    --binding-only ep llep pipelined_llep --no-trace --fill --iters "$iters" --out "$out"
