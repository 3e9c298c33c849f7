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

Beyond the steady state:

- ``add_param_group`` appends the group's parameters to the flat order (earlier offsets unchanged),
  re-partitions the buckets and gives the new parameters host state as torch does lazily (master
  = their value in fp32, ``m = v = 0``, step 0). When the pinned buffer is too small for
  ``12·Θ_r'`` bytes a new one is pinned (about 0.4 s/GiB), then an owned old one released (a
  buffer passed as ``host`` is left to its owner): both are pinned for a moment; the state moves
  through a transient unpinned copy (``12·Θ_r`` bytes).
- In-place changes of the parameters between steps (``model.load_state_dict``, ``p.copy_`` under
  ``no_grad``, ``p.data = t`` with ``t`` of the same shape, dtype and device) are honoured: each
  step compares every parameter's ``_version``, ``data_ptr``, shape and dtype with those recorded
  after the previous step (a Python loop over ``#params``, no
  device work) and re-loads the master of a changed parameter from its current value, so the
  master then equals the working dtype's value, as ``torch.optim.AdamW`` on those parameters
  would see it; ``m``, ``v`` and the step are kept, as torch keeps them. Writes through ``p.data``
  bypass the version counter: call ``reload_params()`` after them. A ``.data`` swap to another
  shape, dtype or device raises ``ValueError`` naming the parameter (its host slots are sized and
  typed at construction): build a new optimizer after resizing a parameter.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from planner.plans.buckets import partition
from planner.runtime import shim
from planner.runtime.offload_adamw_state import OffloadStateMixin
from planner.runtime.offload_checks import check_adamw_groups, check_adamw_params, check_dense_grads, check_max_norm
from planner.runtime.offload_checks import check_register
from planner.runtime.pinned import PinnedBuffer
from planner.runtime.validation import check_adamw_hyper, check_offload_knobs, check_param_groups
from planner.schema.knobs import default as knob_default

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


class OffloadStreamAdamW(OffloadStateMixin, torch.optim.Optimizer):
    """AdamW with fp32 master, m and v in pinned host memory, streamed in flat-slice buckets.

    Args:
        params: the working parameters (bf16, fp16 or fp32; contiguous; one device), or groups.
        lr, betas, eps, weight_decay, maximize: as ``torch.optim.AdamW`` (a group asking for
            ``amsgrad`` is refused: there is no ``max_exp_avg_sq``).
        bucket_params: ``β``, parameters per bucket.
        staging_slots: ``s``.
        register: pin the host state with ``cudaHostRegister`` (default: when CUDA is available).
        host: an already pinned ``PinnedBuffer`` of at least ``12·Θ_r`` bytes to hold the state
            (pin once per job and hand it to a rebuilt optimizer); default: pin a new one.

    Raises:
        ValueError: parameters on several devices, non-contiguous, of another dtype than bf16,
            fp16 or fp32 (float64 would be rounded to the fp32 master, complex lose its imaginary
            part), a group asking for ``amsgrad``, ``staging_slots < 1``, ``register=True``
            where CUDA is not available.
        InvalidPlan: ``bucket_params`` below the cut alignment.
        RuntimeError: any use after ``close()``.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, *, maximize: bool = False, bucket_params: int = knob_default("bucket_params"),
                 staging_slots: int = knob_default("staging_slots"), register: bool | None = None, host: PinnedBuffer | None = None) -> None:
        check_offload_knobs(bucket_params, staging_slots)
        check_adamw_hyper(lr, betas, eps, weight_decay)
        check_register(register)
        self._ready = self._closed = False
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      maximize=maximize))
        check_param_groups(self.param_groups)
        check_adamw_groups("OffloadStreamAdamW", self.param_groups)
        for g in self.param_groups:
            check_adamw_hyper(g["lr"], g["betas"], g["eps"], g["weight_decay"])
        self.bucket_params, self.staging_slots = int(bucket_params), int(staging_slots)
        self._register, self._owns_host, self.host = register, False, None
        self._params: list = []
        self._lay_out(host)
        self._clip_coef: torch.Tensor | None = None
        self._streams = [shim.side_stream(self.device) for _ in range(3)]
        self._ready = True

    @torch.no_grad()
    def _lay_out(self, host: PinnedBuffer | None) -> None:
        """(Re-)partition every parameter of ``param_groups`` and place its host state; earlier
        parameters keep their state (``add_param_group`` appends), new ones start like torch's."""
        params = [p for g in self.param_groups for p in g["params"]]
        check_adamw_params("OffloadStreamAdamW", params)
        self.device = params[0].device
        plan = partition([p.numel() for p in params], self.bucket_params)
        n, n_old, k_old = plan.total, (self.plan.total if self._params else 0), len(self._params)
        if host is not None and host.nbytes < 12 * n:
            raise ValueError(f"host buffer ({host.nbytes} B) must hold 12·Θ_r = {12 * n} B")
        old = [t.clone() for t in (self.master, self.exp_avg, self.exp_avg_sq)] if k_old else []
        if host is None and (self.host is None or self.host.nbytes < 12 * n):
            host = PinnedBuffer(12 * n, register=self._register)  # before anything changes
            if self.host is not None and self._owns_host:
                self.host.release()
            self._owns_host = True
        self.host = host if host is not None else self.host
        self.plan, self._params = plan, params
        self._group_of = [gi for gi, g in enumerate(self.param_groups) for _ in g["params"]]
        self._layouts = [(p.shape, p.dtype, p.device) for p in params]
        self.master = self.host.view(0, n, torch.float32)
        self.exp_avg = self.host.view(4 * n, n, torch.float32)
        self.exp_avg_sq = self.host.view(8 * n, n, torch.float32)
        for dst, src in zip((self.master, self.exp_avg, self.exp_avg_sq), old):
            dst[:n_old].copy_(src)
        self.exp_avg[n_old:].zero_()
        self.exp_avg_sq[n_old:].zero_()
        new_steps = torch.zeros(len(params) - k_old, dtype=torch.float32, device=self.device)
        self.steps = torch.cat([self.steps, new_steps]) if k_old else new_steps
        self._offsets = plan.param_offsets
        for i, p in enumerate(params):
            o, k = self._offsets[i], p.numel()
            if i >= k_old:
                self.master[o:o + k].copy_(p.detach().reshape(-1))
            self.state[p] = {"step": self.steps[i], "master": self.master[o:o + k].view(p.shape),
                             "exp_avg": self.exp_avg[o:o + k].view(p.shape),
                             "exp_avg_sq": self.exp_avg_sq[o:o + k].view(p.shape)}
        self._record_versions()

    def add_param_group(self, param_group: dict) -> None:
        """``torch.optim.Optimizer.add_param_group``; after ``__init__`` the new parameters get
        host state and the buckets are re-partitioned (module docstring: may re-pin).

        Raises:
            ValueError: the new parameters are on another device, not contiguous or of a dtype
                other than bf16, fp16 or fp32, the group asks for ``amsgrad``, or an earlier
                parameter was swapped to another shape or dtype (the group is not added).
        """
        self._check_open()
        if self._ready:
            group = dict(param_group)
            ps = group["params"]
            group["params"] = [ps] if isinstance(ps, torch.Tensor) else list(ps)
            g = {**self.defaults, **group}
            check_adamw_hyper(g["lr"], g["betas"], g["eps"], g["weight_decay"])
            check_adamw_groups("OffloadStreamAdamW", [g], start=len(self.param_groups))
            check_param_groups(self.param_groups, group)
            self._check_layouts(range(len(self._params)))   # the old state moves by the old layout
            param_group = group
        super().add_param_group(param_group)
        if not self._ready:
            return
        self.synchronize()
        try:
            self._lay_out(None)
        except Exception:
            self.param_groups.pop()               # nothing else changed before the failure
            raise

    def _check_open(self) -> None:
        if getattr(self, "_closed", False):
            raise RuntimeError("OffloadStreamAdamW is closed (its host state was released by close()); "
                               "fix: build a new optimizer (and load_state_dict a saved state)")

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
        ``min(1, max_norm/(norm + 1e-6))`` inside the slot. Returns the norm (fp32, device).

        Raises:
            ValueError: ``max_norm`` not a number ``>= 0`` (``inf`` turns clipping off).
        """
        self._check_open()
        max_norm = check_max_norm(max_norm)
        check_dense_grads("OffloadStreamAdamW", self._params)
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
        """One AdamW step over every bucket (parameters without a grad are skipped); parameters
        changed in place since the last step first re-load their master (module docstring)."""
        self._check_open()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        check_dense_grads("OffloadStreamAdamW", self._params)
        self._reload_changed()
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
        self._record_versions()
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

    def close(self) -> None:
        """Synchronise and unpin the host state (idempotent; any later use raises RuntimeError)."""
        if self._closed:
            return
        self.synchronize()
        self.state.clear()
        self.master = self.exp_avg = self.exp_avg_sq = None
        if self._owns_host:
            self.host.release()
        self._closed = True
