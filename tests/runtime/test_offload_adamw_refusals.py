"""What the offloaded AdamWs cannot honour is refused with one clear error, never a changed update
(DESIGN §7: OffloadStreamAdamW is bitwise torch's fused AdamW; CPUOffloadAdamW its baseline):
a ``.data`` swap to another shape or dtype, float64 / complex parameters, ``amsgrad``, a bad
``max_norm``, sparse gradients, a bad ``threads``, use after ``close()``. CPU, one process."""

from __future__ import annotations

import math

import pytest
import torch

from planner.errors import InvalidPlan
from planner.runtime.cpu_offload_adamw import CPUOffloadAdamW
from planner.runtime.offload_adamw import OffloadStreamAdamW
from planner.runtime.pinned import PinnedBuffer

BETA = 32  # p (40 elements) spans two buckets and shares the second with q


def _pair():
    g = torch.Generator().manual_seed(5)
    ours = [torch.nn.Parameter(torch.randn(n, generator=g)) for n in (40, 24)]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    return ours, ref, OffloadStreamAdamW(ours, bucket_params=BETA, register=False), torch.optim.AdamW(ref, fused=True)


def _step(opts, params, seed):
    g = torch.Generator().manual_seed(seed)
    grads = [torch.randn(p.shape, generator=g) for p in params[0]]
    for ps in params:
        for p, gr in zip(ps, grads):
            p.grad = gr.to(p.dtype)
    for o in opts:
        o.step()


@pytest.mark.parametrize("swap", [torch.randn(48), torch.randn(32), torch.randn(8, 5), torch.randn(40).double()],
                         ids=["grew", "shrank", "reshaped", "dtype"])
def test_data_swap_to_another_shape_or_dtype_is_refused_naming_the_parameter(swap):
    """It overwrote the next parameter's master (grew) or failed deep inside (shrank)."""
    ours, ref, opt, torch_opt = _pair()
    _step([opt, torch_opt], [ours, ref], 0)
    kept, sd = ours[0].data, opt.state_dict()
    before = [opt.master.clone(), ours[1].detach().clone()]
    ours[0].data = swap
    want = (r"param_groups\[0\]\['params'\]\[0\] \('\(.*\) torch.float\d\d on cpu'\) must keep the shape, dtype and "
            r"device its host state was laid out for \(\(40,\) torch.float32 on cpu\).*fix: build a new "
            r"OffloadStreamAdamW after resizing")
    for call in (lambda: _step([opt], [ours], 1), opt.reload_params, lambda: opt.load_state_dict(sd),
                 lambda: opt.add_param_group(dict(params=[torch.nn.Parameter(torch.zeros(8))]))):
        with pytest.raises(InvalidPlan, match=want):
            call()
        assert torch.equal(opt.master, before[0]) and torch.equal(ours[1].detach(), before[1])
    assert len(opt.param_groups) == 1
    ours[0].data = kept.clone()                   # the same shape again: honoured, still exact
    _step([opt, torch_opt], [ours, ref], 2)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref))


@pytest.mark.parametrize("cls", [OffloadStreamAdamW, CPUOffloadAdamW])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64])
def test_float64_and_complex_parameters_are_refused(cls, dtype):
    """The fp32 master rounded float64 every step and dropped complex imaginary parts, silently."""
    kw = dict(bucket_params=64) if cls is OffloadStreamAdamW else {}
    lost = "drop its imaginary part" if dtype.is_complex else "round it to float32"
    want = rf"params\[1\].dtype \({dtype}\) must be bfloat16, float16 or float32 \(the fp32 master would {lost}"
    with pytest.raises(InvalidPlan, match=want):
        cls([torch.nn.Parameter(torch.zeros(8)), torch.nn.Parameter(torch.zeros(8, dtype=dtype))], register=False, **kw)
    if cls is OffloadStreamAdamW:
        opt = cls([torch.nn.Parameter(torch.zeros(8))], register=False, **kw)
        with pytest.raises(InvalidPlan, match=want):
            opt.add_param_group(dict(params=[torch.nn.Parameter(torch.zeros(8, dtype=dtype))]))
        assert len(opt.param_groups) == 1
        opt.close()


@pytest.mark.parametrize("option", [dict(amsgrad=True), dict(decoupled_weight_decay=False)])
def test_adamw_options_it_does_not_implement_are_refused(option):
    """A group with ``amsgrad=True`` was accepted and ignored (the update differed from torch's)."""
    (key, value), = option.items()
    want = rf"param_groups\[0\]\['{key}'\] \({value}\) is not supported by OffloadStreamAdamW.*fix: drop '{key}'"
    with pytest.raises(InvalidPlan, match=want):
        OffloadStreamAdamW([dict(params=[torch.nn.Parameter(torch.zeros(8))], **option)], register=False,
                           bucket_params=64)
    ours, ref, opt, torch_opt = _pair()
    with pytest.raises(InvalidPlan, match=want.replace("0", "1", 1)):
        opt.add_param_group(dict(params=[torch.nn.Parameter(torch.zeros(8))], **option))
    sd = opt.state_dict()
    sd["param_groups"][0].update(option)
    with pytest.raises(InvalidPlan, match=want):
        opt.load_state_dict(sd)
    ok = OffloadStreamAdamW([dict(params=ours, amsgrad=False, decoupled_weight_decay=True)], register=False,
                            bucket_params=BETA)
    _step([ok, torch_opt], [ours, ref], 0)        # torch's own defaults are accepted, and exact
    assert all(torch.equal(a, b) for a, b in zip(ours, ref))


@pytest.mark.parametrize("bad", [-1.0, -math.inf, math.nan, "1", True, None, torch.tensor([1.0, 2.0])])
def test_clip_grad_norm_refuses_a_negative_nan_or_non_number_max_norm(bad):
    """-1 flipped the update, NaN made every weight NaN, '1' gave a TypeError from inside."""
    ours, ref, opt, torch_opt = _pair()
    for p in ours:
        p.grad = torch.ones_like(p)
    with pytest.raises(InvalidPlan, match=r"max_norm \(.*\) must be a number >= 0 \(a negative one flips .*; fix"):
        opt.clip_grad_norm_(bad)
    assert opt._clip_coef is None                 # the next step is not scaled


def test_clip_grad_norm_inf_turns_clipping_off_and_a_tensor_max_norm_is_read():
    ours, ref, opt, torch_opt = _pair()
    for max_norm in (math.inf, torch.tensor(1e9)):
        for ps in (ours, ref):
            for p in ps:
                p.grad = torch.full_like(p, 3.0)
        assert float(opt.clip_grad_norm_(max_norm)) > 0
        opt.step()
        torch_opt.step()
        assert all(torch.equal(a, b) for a, b in zip(ours, ref))


@pytest.mark.parametrize("cls", [OffloadStreamAdamW, CPUOffloadAdamW])
def test_sparse_gradients_are_refused_before_anything_changes(cls):
    p = torch.nn.Parameter(torch.randn(10, 4))
    opt = cls([p], register=False, **(dict(bucket_params=64) if cls is OffloadStreamAdamW else {}))
    before = p.detach().clone()
    p.grad = torch.randn(10, 4).to_sparse()
    want = rf"{cls.__name__} does not support sparse gradients: params\[0\].grad has layout torch.sparse_coo; fix"
    calls = [opt.step] + ([lambda: opt.clip_grad_norm_(1.0)] if cls is OffloadStreamAdamW else [])
    for call in calls:
        with pytest.raises(RuntimeError, match=want):
            call()
    assert torch.equal(p.detach(), before)
    if cls is OffloadStreamAdamW:
        assert float(opt.steps.sum()) == 0.0


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_cpu_offload_adamw_threads_are_checked_at_construction(bad):
    """threads=0 failed only at the first step; 1.5 was truncated to 1."""
    with pytest.raises(InvalidPlan, match=rf"threads \({bad!r}\) must be an integer >= 1 or None; fix"):
        CPUOffloadAdamW([torch.nn.Parameter(torch.zeros(8))], threads=bad, register=False)


@pytest.mark.parametrize("cls", [OffloadStreamAdamW, CPUOffloadAdamW, PinnedBuffer])
def test_register_must_be_a_bool_or_none(cls):
    with pytest.raises(InvalidPlan, match=r"register \('yes'\) must be True, False or None"):
        cls(4096 if cls is PinnedBuffer else [torch.nn.Parameter(torch.zeros(8))], register="yes")


def test_cpu_offload_adamw_use_after_close_is_a_clear_error():
    p = torch.nn.Parameter(torch.zeros(8))
    opt = CPUOffloadAdamW([p], register=False)
    sd = opt.state_dict()
    opt.close()
    opt.close()                                   # idempotent
    p.grad = torch.ones(8)
    for call in (opt.step, opt.state_dict, lambda: opt.load_state_dict(sd)):
        with pytest.raises(RuntimeError, match=r"CPUOffloadAdamW is closed .*fix: build a new optimizer"):
            call()
