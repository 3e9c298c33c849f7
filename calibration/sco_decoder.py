"""A stand-in decoder with the real checkpointing structure, for timing SCO against plain
checkpointing (``calibration.sco_overlap``, ``bench/offload_sco.py``).

Per layer an attention region and a gated-MLP region, each RMSNorm → block → residual, each its own
checkpointed region with its input as boundary; ``shape`` sets the interiors' widths, so that one
decoder can be copy-bound (narrow interiors: a boundary's D2H outlasts its region's recompute) or
compute-bound.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from planner.runtime.sco import checkpoint_region


class Decoder:
    """Weights of ``layers`` decoder layers; ``step(run_region)`` runs forward + backward."""

    def __init__(self, shape: dict, device, dtype=torch.bfloat16, seed: int = 0) -> None:
        g = torch.Generator(device=device).manual_seed(seed)
        H, L, A = shape["H"], shape["layers"], shape["heads"] * shape["head_dim"]
        self.s, self.device, self.dtype = shape, device, dtype

        def w(*size, scale=0.02):
            return (torch.randn(*size, device=device, generator=g) * scale).to(dtype).requires_grad_()

        self.w_in = w(H, shape["d_in"], scale=1.0)
        self.layers = [dict(n1=torch.ones(H, device=device, dtype=dtype, requires_grad=True),
                            n2=torch.ones(H, device=device, dtype=dtype, requires_grad=True),
                            wqkv=w(3 * A, H), wo=w(H, A, scale=0.02 / (2 * L) ** 0.5),
                            w1=w(shape["ffn"], H), w3=w(shape["ffn"], H),
                            w2=w(H, shape["ffn"], scale=0.02 / (2 * L) ** 0.5)) for _ in range(L)]

    def params(self) -> list[torch.Tensor]:
        return [self.w_in] + [t for m in self.layers for t in m.values()]

    def attention(self, m, x_BNH):
        s = self.s
        qkv = F.linear(F.rms_norm(x_BNH, (s["H"],), m["n1"]), m["wqkv"])
        q, k, v = qkv.view(1, s["N"], 3, s["heads"], s["head_dim"]).permute(2, 0, 3, 1, 4).unbind(0)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x_BNH + F.linear(o.transpose(1, 2).reshape(1, s["N"], -1), m["wo"])

    def mlp(self, m, x_BNH):
        y = F.rms_norm(x_BNH, (self.s["H"],), m["n2"])
        return x_BNH + F.linear(F.silu(F.linear(y, m["w1"])) * F.linear(y, m["w3"]), m["w2"])

    def regions(self):
        for m in self.layers:
            yield lambda x, m=m: self.attention(m, x)
            yield lambda x, m=m: self.mlp(m, x)

    def step(self, run_region, x_in) -> None:
        h = F.linear(x_in, self.w_in)
        for i, fn in enumerate(self.regions(), start=1):
            h = run_region(i, fn, h)
        ((h * 0.5).sum()).backward()

    def zero_grad(self) -> None:
        for p in self.params():
            if p.grad is not None:
                p.grad.zero_()


def plain_region(i, fn, h):
    """Run region ``i`` under plain ``torch.utils.checkpoint`` (the reference SCO is timed against)."""
    return checkpoint_region(fn, h)


def sdpa_backend(device, math: bool = False):
    """Flash (or math) SDPA on a GPU; nothing on the CPU."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH if math else SDPBackend.FLASH_ATTENTION)
