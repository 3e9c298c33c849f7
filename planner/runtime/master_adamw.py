"""AdamW on the GPU for the composed stack: fp32 master weights, m and v on the device.

Legend: ``Θ_r`` parameters of this optimizer (one rank's share), ``w`` the working weights (bf16),
``master`` their fp32 copies (``4·Θ_r``), ``m``/``v`` the moments (``8·Θ_r``, torch's).

One step: every gradient is upcast to fp32 (``4·Θ_r`` transient; none for fp32 weights), torch's
fused AdamW (``torch.optim.AdamW(fused=True)``) updates the masters in place, and the working
weights are refreshed from them. Collectives: none. With fp32 working weights the result is
bitwise that of ``torch.optim.AdamW(fused=True)`` on the weights themselves.
"""

from __future__ import annotations

import torch

from planner.runtime.validation import check_adamw_hyper, check_param_groups


class MasterAdamW(torch.optim.Optimizer):
    """AdamW over fp32 device masters of ``params`` (``lr``, ``betas``, ``eps``, ``weight_decay``
    as ``torch.optim.AdamW``)."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2) -> None:
        check_adamw_hyper(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        check_param_groups(self.param_groups)
        for g in self.param_groups:
            check_adamw_hyper(g["lr"], g["betas"], g["eps"], g["weight_decay"])
        self._params = [p for g in self.param_groups for p in g["params"]]
        with torch.no_grad():
            self._masters = [p.detach().to(torch.float32, copy=True) for p in self._params]
        it = iter(self._masters)
        groups = [dict({k: v for k, v in g.items() if k != "params"}, params=[next(it) for _ in g["params"]])
                  for g in self.param_groups]
        self.inner = torch.optim.AdamW(groups, fused=True)

    def device_tensors(self) -> list:
        """What this optimizer holds on the device beside the working weights: the fp32 masters
        (its inner AdamW's parameters; their moments are ``self.inner.state``)."""
        return list(self._masters)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for p, m in zip(self._params, self._masters):
            m.grad = None if p.grad is None else p.grad.to(torch.float32)
        self.inner.step()
        for p, m in zip(self._params, self._masters):
            m.grad = None
            if p.grad is not None:
                p.copy_(m)
        return loss
