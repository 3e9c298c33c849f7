"""The decoder of ``planner.runtime.model`` on the CPU: attention variants against a dense float64
softmax, every shipped family's structure (regions, parameter counts), and checkpointing modes.

Exactness (DESIGN §7): an fp32 variant's error against float64 is at most
``max(2·err_torch, 4·eps·‖ref‖)``, ``err_torch`` being the dense fp32 formula's own error; the
checkpointing modes recompute the same operations in the same order, so they are bitwise.
"""

from __future__ import annotations

import pytest
import torch

from planner.runtime.sdpa import causal_attention

TORCH_ERR_FACTOR = 2.0
"""DESIGN §7: the variant may err up to this multiple of the dense fp32 formula's error ..."""
EPS_FACTOR = 4.0
"""... or up to this many fp32 machine epsilons of the reference norm."""
SHAPES = [(13, 4), (16, 4), (7, 16), (20, 5)]
"""(S, w): S not a multiple of w, a multiple, a window longer than S, an odd window."""


def _dense(q, k, v, scale, window, kind, sink):
    B, h, S, _ = q.shape
    k, v = k.repeat_interleave(h // k.shape[1], 1), v.repeat_interleave(h // v.shape[1], 1)
    s = (q @ k.transpose(-1, -2)) * scale
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    ok = j <= i
    if window:
        ok = ok & ((i - j < window) if kind == "sliding" else (i // window == j // window))
    s = s.masked_fill(~ok, float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.to(s.dtype)[None, :, None, None].expand(B, h, S, 1)], -1)
    return s.softmax(-1)[..., :S] @ v


def _bound(ref64, ref32):
    err_torch = (ref32.double() - ref64).norm().item()
    return max(TORCH_ERR_FACTOR * err_torch, EPS_FACTOR * torch.finfo(torch.float32).eps * ref64.norm().item())


@pytest.mark.parametrize("S,w", SHAPES)
@pytest.mark.parametrize("kind", ["sliding", "chunked", "global"])
@pytest.mark.parametrize("sinks", [False, True])
def test_attention_variants_match_dense_softmax(S, w, kind, sinks):
    g = torch.Generator().manual_seed(S * 100 + w)
    q64 = torch.randn(2, 6, S, 8, generator=g, dtype=torch.float64)
    k64 = torch.randn(2, 3, S, 8, generator=g, dtype=torch.float64)
    v64 = torch.randn(2, 3, S, 5, generator=g, dtype=torch.float64)
    sink64 = torch.randn(6, generator=g, dtype=torch.float64) if sinks else None
    go64 = torch.randn(2, 6, S, 5, generator=g, dtype=torch.float64)
    window = None if kind == "global" else w
    local = "sliding" if kind == "global" else kind

    def run(fn, dtype):
        ins = [t.to(dtype).requires_grad_() for t in (q64, k64, v64)]
        sink = sink64.to(dtype).requires_grad_() if sinks else None
        o = fn(*ins, sink)
        grads = torch.autograd.grad(o, ins + ([sink] if sinks else []), go64.to(dtype))
        return [o, *grads]

    ours = run(lambda q, k, v, s: causal_attention(q, k, v, scale=0.3, window=window, local_kind=local,
                                                   sink_h=s), torch.float32)
    ref64 = run(lambda q, k, v, s: _dense(q, k, v, 0.3, window, local, s), torch.float64)
    ref32 = run(lambda q, k, v, s: _dense(q, k, v, 0.3, window, local, s), torch.float32)
    for name, a, r64, r32 in zip(("out", "gq", "gk", "gv", "gsink"), ours, ref64, ref32):
        err = (a.double() - r64).norm().item()
        assert err <= _bound(r64, r32), (name, err, _bound(r64, r32))


def _tiny(name):
    import os

    import yaml

    from planner.schema import ModelSpec

    path = os.path.join(os.path.dirname(__file__), "..", "..", "planner", "profiles", "models", f"{name}.yaml")
    with open(path) as f:
        d = yaml.safe_load(f)
    L = 3
    d.update(num_layers=L, hidden_size=32, vocab_size=40, num_heads=4, head_dim=8,
             num_kv_heads=2 if d["attention"] == "gqa" else 4, mtp_layers=0,
             dense_layers=[i for i in d["dense_layers"] if i < L],
             local_layers=[i for i in d["local_layers"] if i < L])
    if d["num_experts"]:
        d.update(num_experts=8, top_k=min(d["top_k"], 2), expert_ffn=16)
    if d["shared_expert_ffn"]:
        d["shared_expert_ffn"] = 24
    if d["dense_ffn"]:
        d["dense_ffn"] = 40
    if d["sliding_window"]:
        d["sliding_window"] = 3
    if d["mla"]:
        q = 12 if d["mla"]["q_lora_rank"] else None
        d["mla"] = dict(q_lora_rank=q, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
        d.update(head_dim=12, v_head_dim=8, num_kv_heads=4)
    return ModelSpec(**d)


FAMILIES = ["gpt-oss-20b", "deepseek-v2-lite", "deepseek-v3", "qwen3-30b-a3b", "qwen1.5-moe-a2.7b",
            "olmoe-1b-7b", "llama-4-scout-17b-16e", "mixtral-8x7b"]


@pytest.mark.parametrize("name", FAMILIES)
def test_family_structure_and_checkpoint_modes(name):
    from planner.runtime.model import Decoder

    spec = _tiny(name)
    grads, losses = {}, {}
    for mode, rpl in (("none", 2), ("per_layer", 2), ("per_layer", 1)):
        torch.manual_seed(0)
        m = Decoder(spec, dtype=torch.float32)
        m.init_weights()
        m.checkpoint, m.regions_per_layer = mode, rpl
        tok = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(1))
        tgt = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(2))
        loss = m(tok, tgt)
        loss.backward()
        losses[(mode, rpl)] = loss.detach()
        grads[(mode, rpl)] = [p.grad.clone() for p in m.parameters()]
    base = ("none", 2)
    for key in losses:
        assert torch.equal(losses[key], losses[base]), key
        assert all(torch.equal(a, b) for a, b in zip(grads[key], grads[base])), key
    kinds = [k for k, _ in m.regions()]
    want = ["moe" if (spec.is_moe and i not in spec.dense_layers) else "dense_mlp" for i in range(3)]
    assert kinds == want                                          # regions_per_layer = 1 (last)
    m.regions_per_layer = 2
    assert [k for k, _ in m.regions()] == [x for w in want for x in ("attention", w)]
    n = sum(p.numel() for p in m.parameters())
    c = spec.param_counts()
    # not modelled: gpt-oss expert biases; DeepSeek-V3's router bias is a buffer (no gradient)
    missing = spec.num_moe_layers * spec.num_experts * (2 * spec.expert_ffn + spec.hidden_size) * spec.expert_bias
    missing += spec.num_moe_layers * spec.num_experts * (spec.router_bias and spec.model_type == "deepseek_v3")
    assert n == c["total"] - missing
