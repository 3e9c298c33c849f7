"""State handling of ``OffloadStreamAdamW`` (``planner/runtime/offload_adamw.py``): parameters changed
outside the optimizer, ``state_dict`` / ``load_state_dict`` with validation.

Legend: ``master``, ``exp_avg``, ``exp_avg_sq`` are views of the pinned host state (fp32, one flat
slice per parameter at ``_offsets[i]``); ``steps`` the per-parameter fp32 step counters.
"""

from __future__ import annotations

import torch

from planner.errors import InvalidPlan
from planner.runtime import shim
from planner.runtime.offload_checks import check_adamw_groups


class OffloadStateMixin:
    """Mixed into ``OffloadStreamAdamW``; relies on its ``_params``, ``_offsets``, ``_layouts``,
    ``_group_of``, ``master``, ``steps``, ``state``, ``param_groups``, ``synchronize`` and
    ``_check_open``."""

    # -- parameters changed outside the optimizer -----------------------------------------------
    @staticmethod
    def _stamp(p) -> tuple:
        """What an in-place change or a ``.data`` swap alters (fake tensors have no pointer)."""
        return p._version, 0 if shim.is_tracing() else p.data_ptr(), p.shape, p.dtype

    def _check_layouts(self, indices) -> None:
        """The parameters ``indices`` keep the shape, dtype and device their host slots were laid
        out for (a ``.data`` swap to another would read or write past the slot: into the next
        parameter's master)."""
        for i in indices:
            p, (shape, dtype, device) = self._params[i], self._layouts[i]
            if (p.shape, p.dtype, p.device) != (shape, dtype, device):
                gi = self._group_of[i]
                j = next(k for k, q in enumerate(self.param_groups[gi]["params"]) if q is p)
                raise InvalidPlan(
                    f"param_groups[{gi}]['params'][{j}]", f"{tuple(p.shape)} {p.dtype} on {p.device}",
                    f"must keep the shape, dtype and device its host state was laid out for ({tuple(shape)} "
                    f"{dtype} on {device}): a p.data swap to another is not honoured",
                    "build a new OffloadStreamAdamW after resizing a parameter (e.g. after "
                    "resize_token_embeddings), or copy a tensor of the same shape and dtype into it")

    def _record_versions(self) -> None:
        self._seen = [self._stamp(p) for p in self._params]

    @torch.no_grad()
    def reload_params(self, params=None) -> None:
        """Re-load the fp32 master of ``params`` (default: all) from their current values; ``m``,
        ``v`` and the step are kept. Needed only after writes through ``p.data`` (other in-place
        changes are detected at the next ``step``)."""
        self._check_open()
        wanted = None if params is None else {id(p) for p in params}
        indices = [i for i, p in enumerate(self._params) if wanted is None or id(p) in wanted]
        self._check_layouts(indices)
        self.synchronize()
        for i in indices:
            p, o = self._params[i], self._offsets[i]
            self.master[o:o + p.numel()].copy_(p.detach().reshape(-1))
        self._record_versions()

    def _reload_changed(self) -> None:
        changed = [p for p, seen in zip(self._params, self._seen) if self._stamp(p) != seen]
        if changed:
            self.reload_params(changed)

    def state_dict(self):
        """``torch.optim`` layout; per-param ``step``, ``master``, ``exp_avg``, ``exp_avg_sq``.

        The tensors are views of the pinned host state (``torch.save`` stores it once)."""
        self._check_open()
        self.synchronize()
        return super().state_dict()

    def _validated(self, state_dict) -> list:
        """Every parameter's saved entry, checked before anything is copied."""
        for key in ("state", "param_groups"):
            if not isinstance(state_dict, dict) or key not in state_dict:
                raise ValueError(f"loaded state_dict has no '{key}' entry; fix: pass the dict that "
                                 "OffloadStreamAdamW.state_dict() returned")
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(a.get("params", ())) != len(b["params"]) for a, b in zip(groups, self.param_groups)):
            raise ValueError("loaded state_dict has a different param-group layout than this optimizer")
        check_adamw_groups("OffloadStreamAdamW", groups)
        saved_ids = [pid for g in groups for pid in g["params"]]
        out = []
        for p, pid in zip(self._params, saved_ids):
            s = state_dict["state"].get(pid)
            if s is None or not {"step", "master", "exp_avg", "exp_avg_sq"} <= set(s):
                raise ValueError(f"loaded state_dict lacks step/master/exp_avg/exp_avg_sq of parameter {pid}")
            for key in ("master", "exp_avg", "exp_avg_sq"):
                if not isinstance(s[key], torch.Tensor) or tuple(s[key].shape) != tuple(p.shape):
                    got = tuple(s[key].shape) if isinstance(s[key], torch.Tensor) else type(s[key]).__name__
                    raise ValueError(f"loaded state_dict['state'][{pid}]['{key}'] has shape {got}, "
                                     f"must be {tuple(p.shape)} (the parameter's)")
            if isinstance(s["step"], torch.Tensor) and s["step"].numel() != 1:
                raise ValueError(f"loaded state_dict['state'][{pid}]['step'] must be a scalar, "
                                 f"got shape {tuple(s['step'].shape)}")
            out.append(s)
        return out

    @torch.no_grad()
    def load_state_dict(self, state_dict) -> None:
        """Copy a ``state_dict`` of this class into the pinned state; refresh the working weights.

        Raises:
            ValueError: no ``state`` / ``param_groups`` entry, a different number of groups or
                parameters, a missing or wrongly shaped state entry, a group asking for
                ``amsgrad``, a parameter swapped to another shape or dtype (nothing is copied then).
        """
        self._check_open()
        self._check_layouts(range(len(self._params)))
        entries = self._validated(state_dict)
        self.synchronize()
        for i, (p, s) in enumerate(zip(self._params, entries)):
            mine = self.state[p]
            for key in ("master", "exp_avg", "exp_avg_sq"):
                mine[key].copy_(s[key])
            step = s["step"]
            self.steps[i] = step.reshape(()).to(self.steps.device) if isinstance(step, torch.Tensor) else step
            p.detach().copy_(mine["master"])
        for mine, saved in zip(self.param_groups, state_dict["param_groups"]):
            mine.update({k: v for k, v in saved.items() if k != "params"})
        self._record_versions()

