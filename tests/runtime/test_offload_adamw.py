"""OffloadStreamAdamW and CPUOffloadAdamW exactness on the CPU (DESIGN §7).

The reference is ``torch.optim.AdamW(fused=True)`` on the same device over fp32 parameters whose
grads are the bf16 grads upcast: the master weights, m, v and step must be BITWISE equal, and
the bf16 working weights equal to the reference rounded to bf16.
"""

from __future__ import annotations

import io

import pytest
import torch
from normwise import normwise_excess

from planner.runtime.cpu_offload_adamw import CPUOffloadAdamW
from planner.runtime.offload_adamw import OffloadStreamAdamW

SHAPES = [(37, 129), (1000,), (3,), (16 * 5 + 3,), (2, 3, 5), (64, 16)]  # awkward, one tensor spans buckets
GROUP_A, GROUP_B = [0, 2, 4], [1, 3, 5]
HYPER_A = dict(lr=3e-3, weight_decay=0.1)
HYPER_B = dict(lr=1e-3, weight_decay=0.0)
STEPS, SAVE_AT = 5, 2


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter((torch.randn(*s, generator=g) * 0.3).bfloat16()) for s in SHAPES]


def _grads(step):
    g = torch.Generator().manual_seed(100 + step)
    return [(torch.randn(*s, generator=g) * (0.5 + step)).bfloat16() for s in SHAPES]


def _groups(ps, extra=None):
    a = dict(params=[ps[i] for i in GROUP_A], **HYPER_A)
    b = dict(params=[ps[i] for i in GROUP_B], **HYPER_B)
    return [a, b]


def _schedule(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0 / (1 + 0.7 * t))


def _roundtrip(sd):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _run(make, clip=None, skip_grad=None):
    """5 steps of ours and the reference, with a save/load into fresh optimizers after SAVE_AT."""
    ours_p = _params()
    ref_p = [torch.nn.Parameter(p.detach().float()) for p in ours_p]
    ours, ref = make(_groups(ours_p)), torch.optim.AdamW(_groups(ref_p), fused=True)
    s_ours, s_ref = _schedule(ours), _schedule(ref)
    for step in range(STEPS):
        for i, (a, b, g) in enumerate(zip(ours_p, ref_p, _grads(step))):
            none = skip_grad is not None and skip_grad(step, i)
            a.grad = None if none else g.clone()
            b.grad = None if none else g.float()
        if clip is not None:
            # The norm is a reduction (ours over bf16 grads with fp32 accumulation, torch's over fp32
            # grads): norm-wise against float64 (DESIGN §7). The reference then scales by ours'
            # coefficient, as clip_grad_norm_ does (one elementwise multiply), so the step that
            # follows stays provably bitwise.
            n_ours = ours.clip_grad_norm_(clip)
            ref_grads = [p.grad for g in ref.param_groups for p in g["params"] if p.grad is not None]
            n64 = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(r.double()) for r in ref_grads]))
            excess = normwise_excess(n_ours, torch.nn.utils.get_total_norm(ref_grads), n64)
            assert excess is None, excess
            torch._foreach_mul_(ref_grads, torch.clamp(clip / (n_ours + 1e-6), max=1.0))
        ours.step()
        ref.step()
        s_ours.step()
        s_ref.step()
        if step + 1 == SAVE_AT:
            sd_ours, sd_ref = _roundtrip(ours.state_dict()), _roundtrip(ref.state_dict())
            if hasattr(ours, "close"):
                ours.close()
            ours, ref = make(_groups(ours_p)), torch.optim.AdamW(_groups(ref_p), fused=True)
            ours.load_state_dict(sd_ours)
            ref.load_state_dict(sd_ref)
            s_ours, s_ref = _schedule(ours), _schedule(ref)
            s_ours.load_state_dict(s_ref.state_dict())
            s_ref.load_state_dict(s_ref.state_dict())
            for o, r in zip(ours.param_groups, ref.param_groups):
                assert o["lr"] == r["lr"]
    return ours, ours_p, ref, ref_p


def _assert_bitwise(ours, ours_p, ref, ref_p):
    for a, b in zip(ours_p, ref_p):
        st, rs = ours.state[a], ref.state[b]
        if "master" in st:
            assert torch.equal(st["master"], b.detach())
        assert torch.equal(st["exp_avg"], rs["exp_avg"])
        assert torch.equal(st["exp_avg_sq"], rs["exp_avg_sq"])
        assert float(st["step"]) == float(rs["step"])
        assert torch.equal(a.detach(), b.detach().bfloat16())


@pytest.mark.parametrize("beta,slots", [(160, 2), (48, 3), (16, 1), (10**6, 2)])
def test_offload_stream_adamw_bitwise_equal_to_fused_adamw(beta, slots):
    make = lambda groups: OffloadStreamAdamW(groups, bucket_params=beta, staging_slots=slots)  # noqa: E731
    ours, ours_p, ref, ref_p = _run(make)
    assert ours.plan.num_buckets >= (2 if beta < 1000 else 1)
    assert all(b.length <= beta for b in ours.plan.buckets)
    _assert_bitwise(ours, ours_p, ref, ref_p)
    total = sum(p.numel() for p in ours_p)
    assert ours.host_bytes == -(-12 * total // 4096) * 4096
    assert ours.staging_bytes <= slots * beta * 16


def test_offload_stream_adamw_with_clipping_and_missing_grads():
    make = lambda groups: OffloadStreamAdamW(groups, bucket_params=160, staging_slots=2)  # noqa: E731
    out = _run(make, clip=0.5, skip_grad=lambda step, i: (step, i) in {(1, 3), (3, 0)})
    _assert_bitwise(*out)


def test_cuts_aligned_to_16_elements_are_bitwise_on_cpu():
    """Why the buckets align cuts to 16 elements: a cut at a multiple of every CPU float vector width up to 16 lanes keeps
    each element on the same (vector or tail) path of the elementwise kernel, so the result is
    bitwise the uncut one. (An unaligned cut moves elements between the vector body and the tail,
    whose last bit differs on some CPUs and not others, so no test asserts it either way.)"""
    g = torch.Generator().manual_seed(3)
    p, gr = torch.randn(31, generator=g), torch.randn(31, generator=g)
    m, v = torch.randn(31, generator=g).abs() * 0.1, torch.randn(31, generator=g).abs() * 0.01
    kw = dict(amsgrad=False, lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=0.1, eps=1e-8, maximize=False,
              grad_scale=None, found_inf=None)

    def run(cuts):
        x = [t.clone() for t in (p, gr, m, v)]
        for a, b in zip(cuts[:-1], cuts[1:]):
            torch._fused_adamw_(*[[t[a:b]] for t in x], [], [torch.tensor(3.0)], **kw)
        return x

    whole = run([0, 31])
    assert all(torch.equal(a, b) for a, b in zip(whole, run([0, 16, 31])))


def test_cpu_offload_adamw_bitwise_equal_to_fused_adamw():
    make = lambda groups: CPUOffloadAdamW(groups, threads=1)  # noqa: E731
    _assert_bitwise(*_run(make))


def test_bad_arguments():
    with pytest.raises(ValueError, match="staging_slots"):
        OffloadStreamAdamW(_params(), staging_slots=0)
    with pytest.raises(Exception, match="bucket_params"):
        OffloadStreamAdamW(_params(), bucket_params=8)


def _pair_step(ours, ref, ours_p, ref_p, step):
    g = torch.Generator().manual_seed(200 + step)
    for a, b in zip(ours_p, ref_p):
        gr = (torch.randn(a.shape, generator=g) * (0.5 + step)).bfloat16()
        a.grad, b.grad = gr.clone(), gr.float()
    ours.step()
    ref.step()


@pytest.mark.parametrize("new_shapes", [[(10,)], [(3000,), (37, 41)]], ids=["fits", "re-pins"])
def test_add_param_group_is_bitwise_equal_to_fused_adamw(new_shapes):
    """Groups added after 2 steps get host state (re-pinning when the buffer is too small); old
    and new parameters stay bitwise equal to torch, also through a state_dict round trip."""
    ours_p = _params()
    ref_p = [torch.nn.Parameter(p.detach().float()) for p in ours_p]
    ours = OffloadStreamAdamW(_groups(ours_p), bucket_params=160, staging_slots=2)
    ref = torch.optim.AdamW(_groups(ref_p), fused=True)
    for step in range(2):
        _pair_step(ours, ref, ours_p, ref_p, step)
    g = torch.Generator().manual_seed(9)
    extra = [torch.nn.Parameter((torch.randn(*s, generator=g) * 0.3).bfloat16()) for s in new_shapes]
    extra_ref = [torch.nn.Parameter(p.detach().float()) for p in extra]
    host_before = ours.host
    ours.add_param_group(dict(params=extra, lr=2e-3, weight_decay=0.05))
    ref.add_param_group(dict(params=extra_ref, lr=2e-3, weight_decay=0.05))
    total = sum(p.numel() for p in ours_p + extra)
    assert ours.plan.total == total and (ours.host is host_before) == (12 * total <= host_before.nbytes)
    assert ours.host_bytes == -(-12 * total // 4096) * 4096 or ours.host is host_before
    ours_p, ref_p = ours_p + extra, ref_p + extra_ref
    for step in range(2, 4):
        _pair_step(ours, ref, ours_p, ref_p, step)
    _assert_bitwise(ours, ours_p, ref, ref_p)
    fresh = OffloadStreamAdamW(_groups(ours_p[:len(SHAPES)]), bucket_params=160, staging_slots=2)
    fresh.add_param_group(dict(params=extra, lr=2e-3, weight_decay=0.05))
    fresh.load_state_dict(_roundtrip(ours.state_dict()))
    ours.close()
    _pair_step(fresh, ref, ours_p, ref_p, 4)
    _assert_bitwise(fresh, ours_p, ref, ref_p)


def test_add_param_group_rejects_another_device_without_adding_it():
    opt = OffloadStreamAdamW(_params(), bucket_params=160)
    with pytest.raises(ValueError, match="one device"):
        opt.add_param_group(dict(params=[torch.nn.Parameter(torch.zeros(3, device="meta"))]))
    assert len(opt.param_groups) == 1


def test_parameter_changes_between_steps_reload_the_master():
    """``model.load_state_dict``, ``copy_`` and ``.data =`` between steps are honoured (the master
    re-loads the bf16 value, m/v/step kept), exactly as torch's AdamW on those values; a write
    through ``.data`` needs ``reload_params()``."""
    ours_p = _params()
    ref_p = [torch.nn.Parameter(p.detach().float()) for p in ours_p]
    model = torch.nn.ParameterList(ours_p)
    ours = OffloadStreamAdamW(_groups(ours_p), bucket_params=48, staging_slots=3)
    ref = torch.optim.AdamW(_groups(ref_p), fused=True)

    def set_both(i, value_bf16):
        with torch.no_grad():
            ref_p[i].copy_(value_bf16.float())

    for step in range(6):
        _pair_step(ours, ref, ours_p, ref_p, step)
        new = [(p.detach().float() * 0.5 + 0.125).bfloat16() for p in ours_p]
        if step == 0:                               # nn.Module.load_state_dict
            model.load_state_dict({str(i): t for i, t in enumerate(new)})
            for i in range(len(ours_p)):
                set_both(i, new[i])
        elif step == 1:                             # one parameter, in place
            with torch.no_grad():
                ours_p[2].copy_(new[2])
            set_both(2, new[2])
        elif step == 2:                             # a swapped .data tensor
            ours_p[4].data = new[4].clone()
            set_both(4, new[4])
        elif step == 3:                             # invisible to _version: needs reload_params
            ours_p[1].data.copy_(new[1])
            set_both(1, new[1])
            ours.reload_params([ours_p[1]])
    _assert_bitwise(ours, ours_p, ref, ref_p)


def test_use_after_close_and_bad_state_dicts_are_clear_errors():
    ps = _params()
    opt = OffloadStreamAdamW(_groups(ps), bucket_params=160)
    for p, g in zip(ps, _grads(0)):
        p.grad = g
    opt.step()
    sd = _roundtrip(opt.state_dict())
    with pytest.raises(ValueError, match="has no 'state' entry"):
        opt.load_state_dict({"param_groups": sd["param_groups"]})
    with pytest.raises(ValueError, match="has no 'param_groups' entry"):
        opt.load_state_dict({"state": sd["state"]})
    bad = _roundtrip(opt.state_dict())
    bad["state"][3]["exp_avg"] = bad["state"][3]["exp_avg"][:-1]
    before = opt.exp_avg.clone()
    with pytest.raises(ValueError, match=r"state_dict\['state'\]\[3\]\['exp_avg'\] has shape "
                                         r"\(999,\), must be \(1000,\)"):
        opt.load_state_dict(bad)
    assert torch.equal(before, opt.exp_avg)         # nothing was copied
    bad = _roundtrip(opt.state_dict())
    bad["state"][0]["step"] = torch.zeros(2)
    with pytest.raises(ValueError, match=r"\['step'\] must be a scalar"):
        opt.load_state_dict(bad)
    opt.close()
    opt.close()                                     # idempotent
    for call in (opt.step, opt.state_dict, lambda: opt.load_state_dict(sd), opt.reload_params,
                 lambda: opt.add_param_group(dict(params=[torch.nn.Parameter(torch.zeros(2))])),
                 lambda: opt.clip_grad_norm_(1.0)):
        with pytest.raises(RuntimeError, match=r"OffloadStreamAdamW is closed .*fix: build a new optimizer"):
            call()
