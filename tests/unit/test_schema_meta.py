"""Every schema model is frozen, forbids unknown keys, and documents every field (STYLE §6)."""

from __future__ import annotations

import inspect

import pytest
from pydantic import BaseModel, ValidationError

import planner.schema as schema

MODELS = [obj for _, obj in inspect.getmembers(schema, inspect.isclass)
          if issubclass(obj, BaseModel) and obj is not schema.Frozen]


@pytest.mark.parametrize("cls", MODELS, ids=lambda c: c.__name__)
def test_frozen_forbid_documented(cls):
    cfg = cls.model_config
    assert cfg.get("frozen") is True
    assert cfg.get("extra") == "forbid"
    undocumented = [n for n, f in cls.model_fields.items() if not f.description]
    assert not undocumented, f"{cls.__name__} fields without docstrings: {undocumented}"


def test_unknown_key_rejected():
    with pytest.raises(ValidationError, match="extra"):
        schema.Workload(seq_len=4096, bogus=1)


def test_frozen_rejects_assignment():
    w = schema.Workload(seq_len=4096)
    with pytest.raises(ValidationError):
        w.seq_len = 8192
