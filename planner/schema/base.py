"""Base class of every schema model: frozen, ``extra="forbid"``, field docstrings as descriptions."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION = 1
"""Version of the plan-file and profile schema this build reads and writes."""


class Frozen(BaseModel):
    """Immutable, strict-keyed pydantic model; every field is documented by its docstring."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
