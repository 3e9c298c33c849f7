"""A model file whose fields contradict each other is refused in one line: shared-expert width
without shared experts (it was counted, Θ 20.9B → 21.8B), shared experts without a width (they were
dropped), a layer index listed twice."""

from __future__ import annotations

import pytest

from planner.errors import InvalidPlan
from planner.schema.documents import validate
from planner.schema.model import ModelSpec
from planner.schema.profiles import load_model


@pytest.mark.parametrize("update, field, words", [
    ({"num_shared_experts": 0, "shared_expert_ffn": 4096}, "model.shared_expert_ffn", "contradicts"),
    ({"num_shared_experts": 2, "shared_expert_ffn": 0}, "model.shared_expert_ffn", "contradicts"),
    ({"local_layers": (0, 0, 1)}, "model.local_layers", "is listed twice"),
    ({"dense_layers": (1, 1), "dense_ffn": 1024}, "model.dense_layers", "is listed twice"),
])
def test_contradictory_model_fields_are_refused(update, field, words):
    doc = load_model("gpt-oss-20b").model_dump(mode="json")
    with pytest.raises(InvalidPlan) as e:
        validate(ModelSpec, {**doc, **update}, "model")
    assert e.value.field == field and words in str(e.value)


def test_consistent_shared_experts_are_kept():
    doc = load_model("deepseek-v2-lite").model_dump(mode="json")
    assert doc["num_shared_experts"] > 0 and doc["shared_expert_ffn"] > 0
    assert validate(ModelSpec, doc, "model").shared_expert_ffn == doc["shared_expert_ffn"]
