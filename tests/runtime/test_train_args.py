"""``planner.train``'s ``--device``: one line naming the value and the fix, before any process group."""

from __future__ import annotations

import pytest
import torch
import yaml

from planner.api import build_planfile
from planner.errors import InvalidPlan
from planner.runtime import train


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    pf = build_planfile(model="olmoe-1b-7b", gpus=1, seq_len=4096, overrides={"stack": "composed"})
    p = tmp_path_factory.mktemp("plans") / "w1.yaml"
    p.write_text(yaml.safe_dump(pf.model_dump(mode="json")))
    return str(p)


def test_unknown_device_is_refused(plan):
    with pytest.raises(InvalidPlan, match=r"--device \('tpu'\) must be cuda or cpu"):
        train.run(plan, 1, device_type="tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cuda_without_a_gpu_says_so(plan):
    with pytest.raises(InvalidPlan, match="needs a CUDA GPU, and this machine has none; fix: use --device cpu"):
        train.run(plan, 1, device_type="cuda")
