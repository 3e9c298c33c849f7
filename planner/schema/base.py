"""Base class of every schema model: frozen, ``extra="forbid"``, field docstrings as descriptions."""

from __future__ import annotations

import typing

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

SCHEMA_VERSION = 1
"""Version of the plan-file and profile schema this build reads and writes."""

# ---- upper bounds of the integer knobs -----------------------------------------------------------
# Far beyond any real job, and small enough that every per-rank byte count the budget forms stays
# inside numpy's int64 and every plan loop (divisors, chunks) stays short.
MAX_WORLD_SIZE = 1 << 20
"""Largest ``W`` and largest degree (``D``, ``E_p``, ``P``, ``tp``, ``cp``, ``dp_shard``, ``ep``):
2^20 = 1,048,576 ranks."""
MAX_TOKENS = 1 << 32
"""Largest token count (``S``, tokens per sequence group, ``c``, ``m``): 2^32 ≈ 4.3·10^9 tokens."""
MAX_CHUNKS = 1 << 12
"""Largest ``K_max``: 4096 dispatch chunks per layer."""
MAX_IMPORTS = 1 << 20
"""Largest ``n_import_max`` and ``B_v``."""
MAX_BUCKET_PARAMS = 1 << 40
"""Largest OffloadStreamAdamW bucket ``β``: 2^40 ≈ 1.1·10^12 parameters."""
MAX_STAGING_SLOTS = 64
"""Largest number of OffloadStreamAdamW staging slots ``s``."""
MAX_BYTES = 1 << 60
"""Largest byte size a plan may state (1 EiB)."""
MAX_BATCH_TOKENS = 1 << 62
"""Largest ``global_batch_tokens``."""


class Frozen(BaseModel):
    """Immutable, strict-keyed pydantic model; every field is documented by its docstring."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_int(cls, v, info: ValidationInfo):
        """Reject ``true``/``false`` where an integer is expected (pydantic's lax mode reads them as
        1/0, so ``world_size: true`` would plan for one rank)."""
        if isinstance(v, bool) and info.field_name is not None:
            ann = cls.model_fields[info.field_name].annotation
            if _wants_int(ann):
                raise PydanticCustomError("int_not_bool", "must be an integer, not a boolean")
        return v


def check_schema_version(v: int, field: str = "schema_version") -> int:
    """``v`` if it is this build's ``SCHEMA_VERSION``, else ``InvalidPlan`` (profiles and plan files
    of another version are never read silently)."""
    if v != SCHEMA_VERSION:
        from planner.errors import InvalidPlan

        raise InvalidPlan(field, v, f"must be {SCHEMA_VERSION}",
                          "regenerate the file with this version of planner")
    return v


def _wants_int(ann) -> bool:
    """Whether a field annotation is ``int`` or ``int | None`` (not ``bool``)."""
    if ann is int:
        return True
    args = typing.get_args(ann)
    return bool(args) and int in args and bool not in args
