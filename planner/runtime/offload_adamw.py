"""OffloadStreamAdamW: host-resident AdamW state streamed through the GPU in buckets (DESIGN §7).

Legend:
    Θ_r            parameters of this optimizer (one rank's share), flat order = param-group order
    β, s, G        bucket size (parameters), staging slots, buckets (``planner.plans.buckets``)
    master_T, m_T, v_T   fp32 master weights and AdamW moments, host, pinned (``PinnedBuffer``,
                   ``roundup(12·Θ_r, 4 KiB)`` bytes, pinned once in ``__init__``)
    stage_S4B      staging on the device: ``s`` slots × (master, m, v, fp32 grad) × β, fp32,
                   ``s·β·16`` bytes, allocated for the step and freed after it
    w, g           the bf16 working weights and gradients, on the device (the model's own tensors)

Per bucket ``j`` in slot ``j mod s``, on three streams (the shim hands them out; on the CPU and in
trace mode everything runs in order):

    H2D stream      waits until the slot is free (D2H of bucket j-s), copies master, m, v (12 B/param)
    update stream   waits for the H2D; upcasts g into the slot (× the clip coefficient, if set),
                    runs torch's fused AdamW kernel (``torch._fused_adamw_``, the very kernel of
                    ``torch.optim.AdamW(fused=True)``) per param group, refreshes w from master
    D2H stream      waits for the update; copies master, m, v back (12 B/param)

The update is elementwise, so bucketing cannot change it: the result is bitwise equal to
``torch.optim.AdamW(fused=True)`` on fp32 parameters with grads ``g.float()``. Cuts inside a tensor
are 16-element aligned (see ``planner.plans.buckets``), which keeps the CPU kernel's vector and
scalar paths on the same elements. Each parameter has an fp32 step counter on the device (one
tensor of ``#params`` elements), incremented once per step like torch's ``_foreach_add_``.

Gradient clipping: ``clip_grad_norm_(max_norm)`` computes the global norm before the stream, from
the bf16 grads with fp32 accumulation (``torch._foreach_norm(..., dtype=float32)``: bitwise the
norm ``clip_grad_norm_`` computes on the fp32 grads taken in param-group order), and the
coefficient scales the upcast grad in the slot.

Collectives: none. Bytes moved per step: ``12·Θ_r`` H2D and ``12·Θ_r`` D2H. Live device buffers
beyond the model's weights and grads: the staging and the step counters.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from planner.plans.buckets import partition
from planner.runtime import shim
from planner.runtime.pinned import PinnedBuffer

RACE_SLEEP_CYCLES = {"h2d": 0, "update": 0, "d2h": 0}
"""Cycles of ``torch.cuda._sleep`` injected at the head of each stream's work per bucket."""


def set_race_sleep(h2d: int = 0, update: int = 0, d2h: int = 0) -> None:
    """Inject ``torch.cuda._sleep`` on the three streams (0 turns it off)."""
    RACE_SLEEP_CYCLES.update(h2d=int(h2d), update=int(update), d2h=int(d2h))


def _sleep(kind: str, device) -> None:
    if RACE_SLEEP_CYCLES[kind] and shim.use_streams(device):
        torch.cuda._sleep(RACE_SLEEP_CYCLES[kind])


def _scalar(x) -> float:
    return float(x.item()) if isinstance(x, torch.Tensor) else float(x)


class OffloadStreamAdamW(torch.optim.Optimizer):
    """AdamW with fp32 master, m and v in pinned host memory, streamed in flat-slice buckets.

    Args:
        params: the working parameters (bf16, fp16 or fp32; contiguous; one device), or groups.
        lr, betas, eps, weight_decay, maximize: as ``torch.optim.AdamW``.
        bucket_params: ``β``, parameters per bucket.
        staging_slots: ``s``.
        register: pin the host state with ``cudaHostRegister`` (default: when CUDA is available).
        host: an already pinned ``PinnedBuffer`` of at least ``12·Θ_r`` bytes to hold the state
            (pin once per job and hand it to a rebuilt optimizer); default: pin a new one.

    Raises:
        ValueError: parameters on several devices, non-contiguous, or ``staging_slots < 1``.
        InvalidPlan: ``bucket_params`` below the cut alignment.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, *, maximize: bool = False, bucket_params: int = 100_000_000,
                 staging_slots: int = 2, register: bool | None = None, host: PinnedBuffer | None = None) -> None:
        if staging_slots < 1:
            raise ValueError(f"staging_slots ({staging_slots}) must be >= 1")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      maximize=maximize))
        self._params = [p for g in self.param_groups for p in g["params"]]
        self._group_of = [gi for gi, g in enumerate(self.param_groups) for _ in g["params"]]
        devices = {p.device for p in self._params}
        if len(devices) != 1:
            raise ValueError(f"OffloadStreamAdamW needs parameters on one device, got {sorted(map(str, devices))}")
        if not all(p.is_contiguous() for p in self._params):
            raise ValueError("OffloadStreamAdamW needs contiguous parameters")
        self.device = devices.pop()
        self.plan = partition([p.numel() for p in self._params], int(bucket_params))
        self.staging_slots = int(staging_slots)
        n = self.plan.total
        if host is not None and host.nbytes < 12 * n:
            raise ValueError(f"host buffer ({host.nbytes} B) must hold 12·Θ_r = {12 * n} B")
        self.host = host if host is not None else PinnedBuffer(12 * n, register=register)
        self._owns_host = host is None
        self.master = self.host.view(0, n, torch.float32)
        self.exp_avg = self.host.view(4 * n, n, torch.float32)
        self.exp_avg_sq = self.host.view(8 * n, n, torch.float32)
        self.steps = torch.zeros(len(self._params), dtype=torch.float32, device=self.device)
        self._offsets = self.plan.param_offsets
        for i, p in enumerate(self._params):
            o, k = self._offsets[i], p.numel()
            self.master[o:o + k].copy_(p.detach().reshape(-1))
            self.state[p] = {"step": self.steps[i], "master": self.master[o:o + k].view(p.shape),
                             "exp_avg": self.exp_avg[o:o + k].view(p.shape),
                             "exp_avg_sq": self.exp_avg_sq[o:o + k].view(p.shape)}
        self.exp_avg.zero_()
        self.exp_avg_sq.zero_()
        self._clip_coef: torch.Tensor | None = None
        self._streams = [shim.side_stream(self.device) for _ in range(3)]

    # -- sizes ----------------------------------------------------------------------------------
    @property
    def staging_bytes(self) -> int:
        """Device staging of one step: ``min(s, G) · max bucket · 16`` (≤ ``s·β·16``)."""
        return min(self.staging_slots, self.plan.num_buckets) * self.plan.max_bucket * 16

    @property
    def host_bytes(self) -> int:
        """Pinned host bytes of master, m, v: ``roundup(12·Θ_r, 4 KiB)``."""
        return self.host.nbytes

    # -- clipping -------------------------------------------------------------------------------
    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Global 2-norm of the grads (fp32 accumulation); the next ``step`` scales by
        ``min(1, max_norm/(norm + 1e-6))`` inside the slot. Returns the norm (fp32, device)."""
        grads = [p.grad for p in self._params if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self.device)
        norms = torch._foreach_norm(grads, 2.0, dtype=torch.float32)
        total = torch.linalg.vector_norm(torch.stack(norms), 2.0)
        self._clip_coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        return total

    # -- the step -------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW step over every bucket (parameters without a grad are skipped)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        live = [i for i, p in enumerate(self._params) if p.grad is not None]
        if not live:
            return loss
        if len(live) == len(self._params):
            self.steps.add_(1)
        else:
            self.steps.index_add_(0, torch.tensor(live, device=self.device),
                                  torch.ones(len(live), device=self.device))
        has_grad = set(live)
        nslots = min(self.staging_slots, self.plan.num_buckets)
        stage = torch.empty((nslots, 4, self.plan.max_bucket), dtype=torch.float32, device=self.device)
        h2d, upd, d2h = self._streams
        start = shim.record(None, self.device)
        slot_free: list = [None] * nslots
        last_upd = last_d2h = None
        for j, bucket in enumerate(self.plan.buckets):
            k, lo, hi = j % nslots, bucket.start, bucket.start + bucket.length
            w_s, m_s, v_s, g_s = (stage[k, r, :bucket.length] for r in range(4))
            with shim.on_stream(h2d):
                shim.wait(start, h2d)
                shim.wait(slot_free[k], h2d)
                _sleep("h2d", self.device)
                w_s.copy_(self.master[lo:hi], non_blocking=True)
                m_s.copy_(self.exp_avg[lo:hi], non_blocking=True)
                v_s.copy_(self.exp_avg_sq[lo:hi], non_blocking=True)
                loaded = shim.record(h2d, self.device)
            with shim.on_stream(upd):
                shim.wait(start, upd)
                shim.wait(loaded, upd)
                _sleep("update", self.device)
                self._update(bucket, w_s, m_s, v_s, g_s, has_grad)
                last_upd = shim.record(upd, self.device)
            with shim.on_stream(d2h):
                shim.wait(last_upd, d2h)
                _sleep("d2h", self.device)
                self.master[lo:hi].copy_(w_s, non_blocking=True)
                self.exp_avg[lo:hi].copy_(m_s, non_blocking=True)
                self.exp_avg_sq[lo:hi].copy_(v_s, non_blocking=True)
                slot_free[k] = last_d2h = shim.record(d2h, self.device)
        shim.wait(last_upd)
        shim.wait(last_d2h)
        self._clip_coef = None
        del stage
        return loss

    def _update(self, bucket, w_s, m_s, v_s, g_s, has_grad: set) -> None:
        by_group: dict[int, list] = defaultdict(list)
        for sl in bucket.slices:
            if sl.param in has_grad:
                by_group[self._group_of[sl.param]].append(sl)
        for gi, slices in by_group.items():
            cut = lambda t, sl: t[sl.bucket_offset:sl.bucket_offset + sl.length]  # noqa: E731
            for sl in slices:
                g = self._params[sl.param].grad.reshape(-1)[sl.offset:sl.offset + sl.length]
                cut(g_s, sl).copy_(g)
                if self._clip_coef is not None:
                    cut(g_s, sl).mul_(self._clip_coef)
            grp = self.param_groups[gi]
            beta1, beta2 = grp["betas"]
            torch._fused_adamw_(
                [cut(w_s, sl) for sl in slices], [cut(g_s, sl) for sl in slices],
                [cut(m_s, sl) for sl in slices], [cut(v_s, sl) for sl in slices], [],
                [self.steps[sl.param] for sl in slices],
                amsgrad=False, lr=_scalar(grp["lr"]), beta1=_scalar(beta1), beta2=_scalar(beta2),
                weight_decay=float(grp["weight_decay"]), eps=float(grp["eps"]),
                maximize=bool(grp["maximize"]), grad_scale=None, found_inf=None)
            for sl in slices:
                p = self._params[sl.param]
                p.detach().view(-1)[sl.offset:sl.offset + sl.length].copy_(cut(w_s, sl))

    # -- state ----------------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait until the host state reflects every issued step."""
        for s in self._streams:
            if s is not None:
                s.synchronize()

    def state_dict(self):
        """``torch.optim`` layout; per-param ``step``, ``master``, ``exp_avg``, ``exp_avg_sq``.

        The tensors are views of the pinned host state (``torch.save`` stores it once)."""
        self.synchronize()
        return super().state_dict()

    @torch.no_grad()
    def load_state_dict(self, state_dict) -> None:
        """Copy a ``state_dict`` of this class into the pinned state; refresh the working weights.

        Raises:
            ValueError: a different number of groups or parameters, or a missing state entry.
        """
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(a["params"]) != len(b["params"]) for a, b in zip(groups, self.param_groups)):
            raise ValueError("loaded state_dict has a different param-group layout than this optimizer")
        self.synchronize()
        saved_ids = [pid for g in groups for pid in g["params"]]
        for i, (p, pid) in enumerate(zip(self._params, saved_ids)):
            s = state_dict["state"].get(pid)
            if s is None or not {"step", "master", "exp_avg", "exp_avg_sq"} <= set(s):
                raise ValueError(f"loaded state_dict lacks step/master/exp_avg/exp_avg_sq of parameter {pid}")
            mine = self.state[p]
            for key in ("master", "exp_avg", "exp_avg_sq"):
                mine[key].copy_(s[key].reshape(p.shape))
            self.steps[i] = s["step"].to(self.steps.device) if isinstance(s["step"], torch.Tensor) else s["step"]
            p.detach().copy_(mine["master"])
        for mine, saved in zip(self.param_groups, groups):
            mine.update({k: v for k, v in saved.items() if k != "params"})

    def close(self) -> None:
        """Synchronise and unpin the host state (the optimizer is unusable afterwards)."""
        self.synchronize()
        self.state.clear()
        self.master = self.exp_avg = self.exp_avg_sq = None
        if self._owns_host:
            self.host.release()
