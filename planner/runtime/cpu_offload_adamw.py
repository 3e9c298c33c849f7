"""CPUOffloadAdamW: the ZeRO-Offload style baseline of OffloadStreamAdamW (DESIGN §4, §7).

Legend:
    Θ_r          parameters of this optimizer (one rank's share)
    master_T     fp32 master weights, host, pinned (``PinnedBuffer``), leaf tensors of the inner optimizer
    gmaster_T    their fp32 gradients, host, pinned
    xfer_T       the working dtype (bf16) transfer buffer, host, pinned: grads down, weights up
    m, v         AdamW moments, host, created by torch's fused CPU AdamW (pageable, ``zeros_like``)

One step: the bf16 grads are copied down into ``xfer`` (D2H, ``2·Θ_r`` bytes) and upcast on the
CPU into ``gmaster``; torch's fused CPU AdamW (``torch.optim.AdamW(fused=True)``) updates
``master``, m, v with ``threads`` threads; ``master`` is downcast into ``xfer`` and copied up into
the working weights (H2D, ``2·Θ_r`` bytes). The CPU update is serial with the GPU (the time model
charges it at the calibrated CPU AdamW rate). Collectives: none. Live device buffers: none beyond
the model's weights and grads (the copies go straight between them and pinned host memory). Host:
pinned ``roundup(8·Θ_r, 4 KiB) + roundup(2·Θ_r, 4 KiB)`` plus pageable m, v (``8·Θ_r``).
"""

from __future__ import annotations

import contextlib

import torch

from planner.runtime.pinned import PinnedBuffer
from planner.runtime.offload_checks import check_adamw_params, check_dense_grads, check_register, check_threads
from planner.runtime.validation import check_adamw_hyper, check_param_groups


@contextlib.contextmanager
def _threads(n: int | None):
    if n is None:
        yield
        return
    prev = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(prev)


class CPUOffloadAdamW(torch.optim.Optimizer):
    """AdamW on the host: grads down, torch's fused CPU AdamW, working weights up.

    Args:
        params: working parameters (contiguous, one device) or param groups.
        lr, betas, eps, weight_decay, maximize: as ``torch.optim.AdamW``.
        threads: CPU threads for the host update (``torch.set_num_threads`` during the step), an
            integer ``>= 1``; ``None`` keeps torch's.
        register: pin the host buffers with ``cudaHostRegister`` (default: when CUDA is available).

    Raises:
        ValueError: a bad hyper-parameter, ``threads`` or ``register`` (``True`` where CUDA is not
            available), parameters on several devices, non-contiguous or of another dtype than
            bf16, fp16 or fp32 (the fp32 master would round float64 and drop complex parts).
        RuntimeError: a sparse gradient at ``step``; any use after ``close()``.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, *, maximize: bool = False, threads: int | None = None,
                 register: bool | None = None) -> None:
        check_adamw_hyper(lr, betas, eps, weight_decay)
        check_threads(threads)
        check_register(register)
        self._closed = False
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      maximize=maximize))
        check_param_groups(self.param_groups)
        for g in self.param_groups:
            check_adamw_hyper(g["lr"], g["betas"], g["eps"], g["weight_decay"])
        self._params = [p for g in self.param_groups for p in g["params"]]
        check_adamw_params("CPUOffloadAdamW", self._params)
        self.threads = threads
        n = sum(p.numel() for p in self._params)
        dt = self._params[0].dtype if self._params else torch.bfloat16
        esize = dt.itemsize
        self.host = PinnedBuffer(8 * n, register=register)
        self.xfer_buf = PinnedBuffer(esize * n, register=register)
        self.master_flat = self.host.view(0, n, torch.float32)
        self.grad_flat = self.host.view(4 * n, n, torch.float32)
        self.xfer = self.xfer_buf.view(0, n, dt)
        self._masters, self._slices, off = [], [], 0
        for p in self._params:
            k = p.numel()
            m = self.master_flat[off:off + k].view(p.shape)
            m.copy_(p.detach())
            self._masters.append(m)
            self._slices.append((off, k))
            off += k
        it = iter(self._masters)
        inner_groups = [dict({k: v for k, v in g.items() if k != "params"},
                             params=[next(it) for _ in g["params"]]) for g in self.param_groups]
        self.inner = torch.optim.AdamW(inner_groups, fused=True)
        self._refresh_state()

    def _refresh_state(self) -> None:
        for p, m in zip(self._params, self._masters):
            self.state[p] = {"master": m, **self.inner.state.get(m, {})}

    @torch.no_grad()
    def step(self, closure=None):
        """One step: grads down, fused CPU AdamW on the host, working weights up."""
        self._check_open()
        check_dense_grads("CPUOffloadAdamW", self._params)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for p, (o, k) in zip(self._params, self._slices):
            if p.grad is not None:
                self.xfer[o:o + k].copy_(p.grad.reshape(-1), non_blocking=True)
        if any(p.is_cuda for p in self._params):
            torch.cuda.current_stream().synchronize()
        with _threads(self.threads):
            for p, m, (o, k) in zip(self._params, self._masters, self._slices):
                if p.grad is None:
                    m.grad = None
                else:
                    self.grad_flat[o:o + k].copy_(self.xfer[o:o + k])
                    m.grad = self.grad_flat[o:o + k].view(p.shape)
            for mine, inner in zip(self.param_groups, self.inner.param_groups):
                inner.update({k: v for k, v in mine.items() if k != "params"})
            self.inner.step()
            self.xfer.copy_(self.master_flat)
        for p, (o, k) in zip(self._params, self._slices):
            p.detach().view(-1).copy_(self.xfer[o:o + k], non_blocking=True)
        self._refresh_state()
        return loss

    def state_dict(self):
        """``torch.optim`` layout with per-param ``master``, ``step``, ``exp_avg``, ``exp_avg_sq``."""
        self._check_open()
        if any(p.is_cuda for p in self._params):
            torch.cuda.current_stream().synchronize()
        self._refresh_state()
        return super().state_dict()

    @torch.no_grad()
    def load_state_dict(self, state_dict) -> None:
        """Load a ``state_dict`` of this class; refresh the working weights from the masters."""
        self._check_open()
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError("loaded state_dict has a different param-group layout than this optimizer")
        saved_ids = [pid for g in groups for pid in g["params"]]
        for p, m, pid in zip(self._params, self._masters, saved_ids):
            s = state_dict["state"][pid]
            m.copy_(s["master"])
            self.inner.state[m] = {k: s[k].clone() for k in ("step", "exp_avg", "exp_avg_sq") if k in s}
            p.detach().copy_(m)
        for mine, saved in zip(self.param_groups, groups):
            mine.update({k: v for k, v in saved.items() if k != "params"})
        self._refresh_state()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("CPUOffloadAdamW is closed (its host state was released by close()); "
                               "fix: build a new optimizer (and load_state_dict a saved state)")

    def close(self) -> None:
        """Drop the state and unpin the host buffers (idempotent; any later use raises RuntimeError)."""
        if self._closed:
            return
        if any(p.is_cuda for p in self._params):
            torch.cuda.current_stream().synchronize()
        self.state.clear()
        self.inner.state.clear()
        self._masters = []
        self.master_flat = self.grad_flat = self.xfer = None
        self.host.release()
        self.xfer_buf.release()
        self._closed = True
