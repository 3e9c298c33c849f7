"""Profile files for calibration: the core's atomic writers plus a strict mapping reader.

``write_yaml_atomic`` / ``write_text_atomic`` / ``dump_yaml`` are the core's
(``planner.schema.io``): temp file in the same folder, fsync, ``os.replace``, fsync of the folder,
so an interrupted calibration leaves the old profile intact.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from planner.schema.io import dump_yaml, write_text_atomic, write_yaml_atomic

__all__ = ["dump_yaml", "read_yaml", "write_text_atomic", "write_yaml_atomic"]


def read_yaml(path: str | os.PathLike) -> dict:
    """Load one YAML mapping.

    Raises:
        planner.errors.InvalidPlan: the file is missing or not a YAML mapping.
    """
    from planner.errors import InvalidPlan

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as err:
        raise InvalidPlan("profile", str(p), f"cannot be read ({err.strerror})", "give an existing file") from None
    except yaml.YAMLError as err:
        raise InvalidPlan("profile", str(p), f"is not valid YAML ({err.__class__.__name__})",
                          "fix the file or re-run `planner calibrate`") from None
    if not isinstance(data, dict):
        raise InvalidPlan("profile", str(p), "must hold one YAML mapping", "re-run `planner calibrate`")
    return data
