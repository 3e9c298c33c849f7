"""Argument checks of the offloading operators (SCO, OffloadStreamAdamW, CPUOffloadAdamW): what their
maths or the host they run on cannot honour is refused with ``InvalidPlan`` (a ``ValueError``),
one line naming the argument, its value and the fix, at construction where the facts are known.

- ``check_sco_device`` / ``check_region_input``: SCO's device, a region's index and boundary;
- ``check_register``: ``cudaHostRegister`` pinning asked for where CUDA is not available;
- ``check_adamw_params`` / ``check_adamw_groups``: the parameter list (one device, contiguous,
  dtypes an fp32 master holds: not complex or float64) and ``torch.optim.AdamW`` group options
  the offloaded AdamWs do not implement (``amsgrad``);
- ``check_max_norm``, ``check_threads``: the clipping norm, the host update's threads;
- ``check_dense_grads``: sparse gradients (torch's AdamW refuses them too);
- ``check_version``: a saved tensor changed in place before its backward (torch's wording);
- ``on_device``: a tensor is on an operator's device.
"""

from __future__ import annotations

import math
import numbers

import torch

from planner.errors import InvalidPlan
from planner.runtime import shim
from planner.runtime.validation import check_not_meta

ADAMW_PARAM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
"""Working dtypes an fp32 master represents exactly (a float64 or complex one would be rounded or
lose its imaginary part every step)."""

UNSUPPORTED_GROUP_OPTIONS = {"amsgrad": False, "decoupled_weight_decay": True}
"""``torch.optim.AdamW`` options the offloaded AdamWs do not implement, with the only value they
honour (another value would be accepted by ``torch.optim.Optimizer`` and silently ignored)."""


def check_register(register) -> None:
    """``register`` is ``None`` (pin when CUDA is available), ``False``, or ``True`` where CUDA is."""
    if register is not None and not isinstance(register, bool):
        raise InvalidPlan("register", register, "must be True, False or None",
                          "pass None to pin with cudaHostRegister when CUDA is available")
    if register and not torch.cuda.is_available():
        raise InvalidPlan("register", register, "needs CUDA (cudaHostRegister), which is not available here",
                          "pass register=None (pins only when CUDA is available) or register=False")


def check_adamw_params(owner: str, params) -> None:
    """The parameters are on one device, contiguous, hold data and have a working dtype of
    ``ADAMW_PARAM_DTYPES``."""
    devices = {p.device for p in params}
    if len(devices) != 1:
        raise ValueError(f"{owner} needs parameters on one device, got {sorted(map(str, devices))}")
    if not all(p.is_contiguous() for p in params):
        raise ValueError(f"{owner} needs contiguous parameters")
    check_not_meta(**{f"params[{i}]": p for i, p in enumerate(params)})
    for i, p in enumerate(params):
        if p.dtype not in ADAMW_PARAM_DTYPES:
            lost = "drop its imaginary part" if p.dtype.is_complex else "round it to float32"
            raise InvalidPlan(f"params[{i}].dtype", p.dtype,
                              f"must be bfloat16, float16 or float32 (the fp32 master would {lost} every step)",
                              f"use torch.optim.AdamW for this parameter, not {owner}")


def check_adamw_groups(owner: str, groups, start: int = 0) -> None:
    """No group asks for a ``torch.optim.AdamW`` option of ``UNSUPPORTED_GROUP_OPTIONS`` (the
    groups are ``param_groups[start:]``)."""
    for gi, g in enumerate(groups, start=start):
        for key, honoured in UNSUPPORTED_GROUP_OPTIONS.items():
            if key in g and g[key] is not None and bool(g[key]) != honoured:
                raise InvalidPlan(f"param_groups[{gi}]['{key}']", g[key],
                                  f"is not supported by {owner} (only {key}={honoured} is implemented)",
                                  f"drop '{key}' from the group, or use torch.optim.AdamW")


def check_max_norm(max_norm) -> float:
    """``max_norm`` is a number ``>= 0`` (``inf``: no clipping; ``0`` zeroes the gradients, as in
    ``torch.nn.utils.clip_grad_norm_``); returns it as a float."""
    if isinstance(max_norm, torch.Tensor) and max_norm.numel() == 1 and max_norm.dtype.is_floating_point:
        max_norm = float(max_norm)
    if isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real) or math.isnan(max_norm) \
            or max_norm < 0:
        raise InvalidPlan("max_norm", max_norm, "must be a number >= 0 (a negative one flips the update, "
                          "NaN makes the weights NaN; inf turns clipping off)",
                          "pass the largest global gradient norm to allow, e.g. 1.0")
    return float(max_norm)


def check_threads(threads) -> None:
    """``threads`` is ``None`` (torch's current count) or an integer ``>= 1``."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, numbers.Integral)
                                or threads < 1):
        raise InvalidPlan("threads", threads, "must be an integer >= 1 or None",
                          "pass None to keep torch's thread count, or e.g. threads=8")


def check_dense_grads(owner: str, params) -> None:
    """No parameter has a sparse gradient (``torch.optim.AdamW`` refuses them as well)."""
    for i, p in enumerate(params):
        if p.grad is not None and p.grad.layout != torch.strided:
            raise RuntimeError(f"{owner} does not support sparse gradients: params[{i}].grad has layout "
                               f"{p.grad.layout}; fix: use dense gradients (e.g. nn.Embedding(sparse=False)) "
                               "or torch.optim.SparseAdam for that parameter")


def check_version(t: torch.Tensor, saved: int, what: str) -> None:
    """torch's check that a saved tensor was not changed in place before its backward (it skips
    tensors that pass through saved-tensor hooks), with its error, naming ``what``."""
    if t._version != saved:
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an inplace operation: "
            f"{what} [{t.dtype} {list(t.shape)}] is at version {t._version}; expected version {saved} instead; "
            "fix: change it out of place until its backward has run (h = h * 3, not h.mul_(3)), as "
            "torch.utils.checkpoint requires")


def on_device(t: torch.Tensor, device: torch.device) -> bool:
    """``t`` lives on ``device`` (``cuda`` without an index: the current CUDA device)."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return t.device == device


def check_sco_device(device: torch.device) -> None:
    """SCO's device holds data (``meta`` only in the planner's traces)."""
    if device.type == "meta" and not shim.is_tracing():
        raise InvalidPlan("device", device.type, "holds no data: SCO could neither offload nor restore a "
                          "boundary there (meta is for the planner's traces)",
                          "pass the device the boundaries live on, e.g. 'cuda' or 'cpu'")


def check_region_input(index, h, num_boundaries: int, offload_as: tuple | None) -> None:
    """``index`` in ``1..L_b``; ``h`` a tensor with data; an offloaded one (``offload_as``: the
    SCO's shape, dtype and device) contiguous and of that shape, dtype and device."""
    if isinstance(index, bool) or not isinstance(index, numbers.Integral) or not 1 <= index <= num_boundaries:
        raise ValueError(f"region index ({index!r}) must be an integer in 1..{num_boundaries}")
    if not isinstance(h, torch.Tensor):
        raise InvalidPlan("h", h, "must be a torch.Tensor (the region's input boundary)",
                          "pass the boundary tensor, e.g. the previous region's output")
    check_not_meta(h=h)
    if offload_as is not None:
        shape, dtype, device = offload_as
        if tuple(h.shape) != shape or h.dtype != dtype or not h.is_contiguous() or not on_device(h, device):
            raise ValueError(f"boundary {index} ({tuple(h.shape)}, {h.dtype}, {h.device}) must be a contiguous "
                             f"{shape} {dtype} tensor on {device} to be offloaded; fix: build the SCO with "
                             "the boundaries' shape, dtype and device")
