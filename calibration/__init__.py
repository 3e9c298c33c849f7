"""Calibration microbenchmarks that write cluster profiles (DESIGN §6).

- ``run(out_path, *, quick, progress=True, command, smoke=False, name=None, only=None, budgets=None)
  -> ClusterSpec``: measure this machine, every section of ``calibration.config``'s grid or the
  ``only`` ones, the coverage sections under their wall ``budgets`` (``planner calibrate``,
  ``python -m calibration --out FILE [--quick] [--smoke] [--sections A,B] [--attention-budget-s S]``).
- ``merge(profile_path, measured_path, *, out_path=None) -> ClusterSpec``: fold measurements into
  a declared profile (``python -m calibration.merge``).
- ``write_yaml_atomic(path, data)``: the atomic profile writer.
- ``calibration.collectives``: NCCL curves under ``torchrun`` (W ≥ 2).

``run`` and the benchmarks import torch (through ``planner.runtime``); ``merge`` and ``io`` do not.
The planner core never imports this package.
"""

__all__ = ["run", "merge", "write_yaml_atomic"]

_WHERE = {"run": "calibration.runner", "merge": "calibration.merge", "write_yaml_atomic": "calibration.io"}


def __getattr__(name: str):
    """Lazy exports, so that ``python -m calibration.merge`` and ``-m calibration.collectives`` run
    their module once and ``merge`` works without torch."""
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'calibration' has no attribute {name!r}")
