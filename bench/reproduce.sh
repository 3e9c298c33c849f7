#!/usr/bin/env bash
# Reproduce the committed GPU results of bench/results/ on one H200, one group per call (each group
# fits the device's 10-minute limit). Run from the repository root on the GPU machine:
#
#   OUT=/some/dir bash bench/reproduce.sh vocab-offload   # bench/vocab.py, bench/offload.py --race,
#                                                          # the fp32 GEMM table; trace+runtime tests on CPU
#   OUT=/some/dir bash bench/reproduce.sh dispatch        # bench/dispatch.py shape A, then B; host-cast and
#                                                          # chunk-count calibration; dispatch trace tests on CPU
#   OUT=/some/dir bash bench/reproduce.sh host            # dispatch-kernel microbenchmark, host AdamW/cast
#                                                          # tables, offload bench: one machine instance
#
# Everything lands in $OUT/r/ and, after each step, in $OUT/<group>.tgz (a timed-out later step
# keeps the earlier results). The pydantic wheels are installed from .whl when the machine lacks
# pydantic (see ../shared/tools/device-wheels.sh). Prints each step's exit status.
set -u
group=${1:-}
case "$group" in vocab-offload|dispatch|host) ;; *)
  echo "error: group ('$group') must be one of vocab-offload, dispatch, host; fix: bash bench/reproduce.sh dispatch" >&2
  exit 2;;
esac
: "${OUT:?set OUT to the output folder}"
R=$OUT/r; mkdir -p "$R"
if ! python3 -c 'import pydantic' 2>/dev/null && [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
pack() { tar czf "$OUT/$group.tgz" -C "$R" .; }
step() {  # step NAME SECONDS CMD...: run with a timeout, log to $R/NAME.log, pack
  local name=$1 t=$2; shift 2
  timeout "$t" "$@" > "$R/$name.log" 2>&1; echo "$name rc=$?"; pack
}
case "$group" in
vocab-offload)
  nvidia-smi --query-gpu=index,name,memory.used --format=csv > "$R/nvidia-smi.txt"
  (CUDA_VISIBLE_DEVICES= timeout 400 python3 -m pytest tests/trace tests/runtime -q -p no:cacheprovider \
     > "$R/tests_torch.log" 2>&1; echo "tests rc=$?") &
  step vocab 270 python3 bench/vocab.py --iters 2 --out "$R"
  step offload 230 python3 bench/offload.py --race --out "$R"
  step fp32 40 python3 -m calibration.compute --fp32-gemm --out "$R/gemm_fp32.yaml"
  wait;;
dispatch)
  mkdir -p "$R/A" "$R/B"
  (CUDA_VISIBLE_DEVICES= timeout 400 python3 -m pytest tests/trace/test_dispatch_trace.py -q -p no:cacheprovider \
     > "$R/tests_dispatch_torch.log" 2>&1; echo "tests rc=$?") &
  step dispatch_A 230 python3 bench/dispatch.py --shapes A --out "$R/A"
  step dispatch_B 150 python3 bench/dispatch.py --shapes B --out "$R/B"
  step cal_part 100 python3 -m calibration --sections cpu_cast,chunk_count --out "$R/cal_part.yaml" --no-progress
  wait;;
host)
  step dispatch_kernels 130 python3 -m calibration.dispatch_kernels --out "$R"
  step cpu_host 40 python3 -m calibration --sections cpu_adamw,cpu_cast --out "$R/cpu_host.yaml" --no-progress
  step offload 150 python3 bench/offload.py --race --out "$R";;
esac
pack
ls -la "$R"
