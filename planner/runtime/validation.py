"""Argument checks at the operators' entry points (their Python API), in torch's wording where torch
has one: a malformed argument raises at construction or at the first call instead of returning a
wrong result.

- ``check_dispatch_knobs`` / ``check_dispatch_shard``: a dispatch operator's construction;
- ``check_dispatch_inputs``: each call (shapes and dtypes; the id range where routes are counted);
- ``check_targets``: Ring-DTP's targets dtype;
- ``check_sco``: SCO's construction;
- ``check_adamw_hyper`` / ``check_param_groups``: the offloaded AdamWs' hyper-parameters and
  parameter lists (``torch.optim.AdamW``'s messages);
- ``check_int_range`` / ``check_choice`` / ``check_alloc``: the shared building blocks (an integer
  in bounds, one of a few strings, a tensor that fits the device it is allocated on).

Every message names the argument, repeats its value and says what it must be.
"""

from __future__ import annotations

import math
import numbers

import torch


def _int_at_least(name: str, v, lo: int, allow_none: bool = False) -> None:
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
        raise ValueError(f"{name} ({v!r}) must be an integer >= {lo}")


def check_int_range(name: str, v, lo: int, hi: int | None = None, *, fix: str = "") -> None:
    """``v`` is an integer (not a bool, not a float such as ``1.5`` or NaN) in ``[lo, hi]``."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo or (hi is not None and v > hi):
        want = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
        raise ValueError(f"{name} ({v!r}) must be {want}" + (f"; fix: {fix}" if fix else ""))


def check_choice(name: str, v, choices, allow_none: bool = False) -> None:
    """``v`` is one of ``choices`` (strings)."""
    if v is None and allow_none:
        return
    if not isinstance(v, str) or v not in choices:
        shown = ", ".join(repr(c) for c in choices) + (" or None" if allow_none else "")
        raise ValueError(f"{name} ({v!r}) must be one of {shown}")


def device_bytes(device) -> int | None:
    """Memory of ``device``: host RAM for the CPU, the GPU's total memory for CUDA, ``None`` for
    ``meta`` (nothing is allocated) or where the platform does not say."""
    dev = torch.device("cpu" if device is None else device)
    if dev.type == "cpu":
        return host_ram_bytes()
    if dev.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(dev.index or 0).total_memory
    return None


MAX_TENSOR_BYTES = 1 << 62
"""Largest tensor the operators build anywhere (torch's storage size is an int64 byte count)."""


def check_alloc(names: str, numel: int, dtype, device) -> None:
    """A tensor of ``numel`` elements of ``dtype`` fits ``device`` (``device_bytes``) and torch's
    storage size, checked before allocating (no overflow, ``MemoryError`` or allocator error).
    ``names``: the arguments that give its size, with their values."""
    itemsize = (dtype if dtype is not None else torch.get_default_dtype()).itemsize
    nbytes = int(numel) * itemsize
    cap = device_bytes(device)
    if nbytes > MAX_TENSOR_BYTES or (cap is not None and nbytes > cap):
        where = f"{cap} bytes on {torch.device('cpu' if device is None else device)}" if cap is not None \
            and nbytes <= MAX_TENSOR_BYTES else f"torch's limit of {MAX_TENSOR_BYTES} bytes"
        raise ValueError(f"{names}: a tensor of {nbytes} bytes, more than {where}; fix: lower them")


def check_dispatch_knobs(num_experts, top_k, *, token_budget, max_chunks, alpha, min_tokens, lam,
                         max_imports, block_rows) -> None:
    """The knobs of a dispatch operator (DESIGN §1): counts are integers in range, ``α`` and ``λ``
    are numbers ``>= 1`` (``α = inf`` means no cap; NaN is refused)."""
    _int_at_least("num_experts", num_experts, 1)
    _int_at_least("top_k", top_k, 1)
    if top_k > num_experts:
        raise ValueError(f"top_k ({top_k}) must be <= num_experts ({num_experts})")
    _int_at_least("token_budget", token_budget, 1)
    _int_at_least("max_chunks", max_chunks, 1)
    _int_at_least("min_tokens", min_tokens, 1)
    _int_at_least("max_imports", max_imports, 0)
    _int_at_least("block_rows", block_rows, 1, allow_none=True)
    for name, v, finite in (("alpha", alpha, False), ("lam", lam, True)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or math.isnan(v) or v < 1 \
                or (finite and math.isinf(v)):
            raise ValueError(f"{name} ({v!r}) must be a number >= 1" + (" and finite" if finite else ""))


def check_dispatch_shard(shard, num_experts: int, group_size: int, rank: int, shard_type: type) -> None:
    """``shard`` is a ``shard_type`` (``ExpertShard``) of ``E / W`` experts, ``num_experts`` splits
    evenly over the group, and a ``first_expert`` given to the shard is where the operator puts it
    (expert ``e`` on rank ``e // (E/W)``, so ``rank · E/W``); one not given is set to that."""
    if not isinstance(shard, shard_type):
        raise ValueError(f"shard ({type(shard).__name__}) must be a planner.runtime.expert_mlp.ExpertShard "
                         "(the stacked weights of this rank's experts)")
    if num_experts % group_size or shard.num_local != num_experts // group_size:
        raise ValueError(f"num_experts ({num_experts}) must equal the group size ({group_size}) times the "
                         f"shard's experts ({shard.num_local})")
    first = rank * shard.num_local
    if shard.first_expert_given and shard.first_expert != first:
        raise ValueError(f"first_expert ({shard.first_expert}) of the shard must be rank · num_local = {rank} · "
                         f"{shard.num_local} = {first}: the operator places expert e on rank e // num_local; fix: "
                         f"pass first_expert={first} or leave it out")
    shard.first_expert = first


def check_max_imports(max_imports: int, num_experts: int, group_size: int, default: int) -> int:
    """``max_imports`` at most ``E − E/W``, the experts a rank does not own (``import_bound``, the
    planner's rule, ``planner.plans.llep.resolve_max_imports``): the knob's default is lowered to
    the bound, a larger given value is refused; with ``W = 1`` nothing can be imported and the
    value is inert, left as it is (as the planner leaves it, so a plan file runs unchanged)."""
    from planner.plans.llep import resolve_max_imports

    return resolve_max_imports(max_imports, num_experts, group_size, default, field="max_imports",
                               flag="max_imports =")


def check_dispatch_inputs(x_NH: torch.Tensor, ids_Nk: torch.Tensor, weights_Nk: torch.Tensor, *,
                          hidden_size: int, num_experts: int, top_k: int) -> None:
    """``x_NH`` is ``N×H``; ``ids_Nk`` integer and ``weights_Nk`` floating, both ``N×k`` (shapes and
    dtypes only: no kernel, no sync). The id range is checked where the plan counts the routes
    (``planner.runtime.routing.local_counts``)."""
    if x_NH.dim() != 2 or x_NH.shape[1] != hidden_size:
        raise ValueError(f"x_NH has shape {tuple(x_NH.shape)}, must be (N, {hidden_size})")
    n = x_NH.shape[0]
    if tuple(ids_Nk.shape) != (n, top_k):
        raise ValueError(f"ids_Nk has shape {tuple(ids_Nk.shape)}, must be ({n}, {top_k}) (one row per token "
                         f"of x_NH, top_k columns)")
    if tuple(weights_Nk.shape) != (n, top_k):
        raise ValueError(f"weights_Nk has shape {tuple(weights_Nk.shape)}, must be ({n}, {top_k})")
    if ids_Nk.dtype.is_floating_point or ids_Nk.dtype.is_complex or ids_Nk.dtype == torch.bool:
        raise ValueError(f"ids_Nk must be an integer tensor, got {ids_Nk.dtype}")
    if not weights_Nk.dtype.is_floating_point:
        raise ValueError(f"weights_Nk must be a floating-point tensor, got {weights_Nk.dtype}")


def check_targets(targets_N: torch.Tensor) -> None:
    """Class-index targets are integers (torch's ``cross_entropy`` reads floating targets as
    probabilities; truncating them to ids would give a wrong loss)."""
    dt = targets_N.dtype
    if dt.is_floating_point or dt.is_complex or dt == torch.bool:
        raise ValueError(f"targets_N must hold class indices of an integer dtype (expected scalar type Long), "
                         f"got {dt}")


def max_boundaries() -> int:
    """``L_b = 2L`` for the largest model the schema accepts (``ModelSpec.num_layers``'s bound)."""
    from planner.schema.model import ModelSpec

    return 2 * next(m.le for m in ModelSpec.model_fields["num_layers"].metadata if getattr(m, "le", None))


def check_sco(num_boundaries, boundary_shape, host_budget_bytes, dtype=None, device=None) -> None:
    """SCO's construction: ``1 <= L_b <= max_boundaries()`` boundaries of a non-empty shape (a
    tuple of positive integers) that fits ``device``, a budget ``>= 0``."""
    check_int_range("num_boundaries", num_boundaries, 1, max_boundaries(),
                    fix="one boundary per checkpointed region, L_b = 2L")
    if isinstance(boundary_shape, (str, bytes)) or not isinstance(boundary_shape, (tuple, list, torch.Size)):
        raise ValueError(f"boundary_shape ({boundary_shape!r}) must be a tuple of positive integers, e.g. (N, H)")
    shape = tuple(boundary_shape)
    if not shape or any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 1 for s in shape):
        raise ValueError(f"boundary_shape ({shape!r}) must be positive integers")
    check_alloc(f"boundary_shape ({shape!r})", math.prod(shape), dtype, device)
    if isinstance(host_budget_bytes, bool) or not isinstance(host_budget_bytes, numbers.Real) \
            or not host_budget_bytes >= 0:
        raise ValueError(f"host_budget_bytes ({host_budget_bytes!r}) must be a number >= 0")


def _is_real(v) -> bool:
    return (isinstance(v, numbers.Real) and not isinstance(v, bool)) or \
        (isinstance(v, torch.Tensor) and v.numel() == 1 and v.dtype.is_floating_point)


def check_adamw_hyper(lr, betas, eps, weight_decay) -> None:
    """``torch.optim.AdamW``'s checks, with its messages (NaN fails them too); before them, what
    torch leaves to a ``TypeError`` or an ``IndexError`` (``betas`` a pair of numbers, the others
    numbers), after them what it accepts and turns into non-finite weights (``inf``)."""
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")
    for name, v in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
        if not _is_real(v):
            raise ValueError(f"{name} ({v!r}) must be a number")
    if isinstance(betas, (str, bytes)) or not isinstance(betas, (tuple, list)) or len(betas) != 2 \
            or not all(_is_real(b) for b in betas):
        raise ValueError(f"betas ({betas!r}) must be a pair of numbers (beta1, beta2), e.g. (0.9, 0.999)")
    _torch_adamw_checks(lr, betas, eps, weight_decay)
    for name, v in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
        if not math.isfinite(float(v)):
            raise ValueError(f"{name} ({float(v)!r}) must be finite (it would make the weights non-finite)")


def _torch_adamw_checks(lr, betas, eps, weight_decay) -> None:
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


def check_offload_knobs(bucket_params, staging_slots) -> None:
    """``β`` and ``s`` of ``OffloadStreamAdamW``: integers in the plan schema's bounds (``β`` at least
    the cut alignment of ``planner.plans.buckets``)."""
    from planner.plans.buckets import BUCKET_ALIGN
    from planner.schema.base import MAX_BUCKET_PARAMS, MAX_STAGING_SLOTS

    check_int_range("bucket_params", bucket_params, BUCKET_ALIGN, MAX_BUCKET_PARAMS,
                    fix="use a bucket of at least a few million parameters, e.g. 100_000_000")
    check_int_range("staging_slots", staging_slots, 1, MAX_STAGING_SLOTS, fix="use 2")


def check_param_groups(groups, new: dict | None = None) -> None:
    """No parameter listed twice, within a group or across groups. torch warns on the first (its
    result is still right, ours would not be) and raises on the second; both raise here."""
    seen: set[int] = set()
    for g in groups:
        ids = [id(p) for p in g["params"]]
        if len(ids) != len(set(ids)):
            raise ValueError("optimizer contains a parameter group with duplicate parameters")
        seen |= set(ids)
    if new is not None:
        ids = [id(p) for p in new["params"]]
        if len(ids) != len(set(ids)):
            raise ValueError("optimizer contains a parameter group with duplicate parameters")
        if seen & set(ids):
            raise ValueError("some parameters appear in more than one parameter group")


DTYPE_NAMES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32,
               "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16}
"""Strings an operator accepts for a dtype (the plan file's ``act_dtype`` spellings and torch's)."""
DEVICE_TYPES = ("cpu", "cuda", "meta")
"""Devices the operators run on (``meta`` to build a model before ``to_empty``)."""


def check_positive_ints(**values) -> None:
    """Each named value is an integer ``>= 1`` (not a bool)."""
    for name, v in values.items():
        _int_at_least(name, v, 1)


def floating_dtype(name: str, dtype, allow_none: bool = False):
    """``dtype`` as a floating ``torch.dtype``: a ``torch.dtype`` or one of ``DTYPE_NAMES``."""
    if dtype is None and allow_none:
        return None
    if isinstance(dtype, str):
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"{name} ({dtype!r}) must be a torch.dtype or one of {', '.join(DTYPE_NAMES)}")
        return DTYPE_NAMES[dtype]
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"{name} ({dtype!r}) must be a floating torch.dtype (e.g. torch.bfloat16)")
    return dtype


def checked_device(name: str, device, allow_none: bool = False):
    """``device`` as a ``torch.device`` of a type in ``DEVICE_TYPES``, CUDA only when available."""
    if device is None and allow_none:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{name} ({device!r}) must be a torch device: one of {', '.join(DEVICE_TYPES)}") from None
    if dev.type not in DEVICE_TYPES:
        raise ValueError(f"{name} ({device!r}) must be one of {', '.join(DEVICE_TYPES)}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name} ({device!r}) is a CUDA device but CUDA is not available here")
    return dev


def check_not_meta(**tensors) -> None:
    """Inputs hold data: a ``meta`` tensor has none (build on ``meta``, then ``to_empty``; trace with
    fake tensors)."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.device.type == "meta":
            raise ValueError(f"{name} is a meta tensor (no data): move it to a real device first "
                             "(module.to_empty(device=...) for parameters)")


def host_ram_bytes() -> int | None:
    """Physical memory of this host (``os.sysconf``), ``None`` where the platform does not say."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_host_bytes(name: str, nbytes: int) -> None:
    """``nbytes`` of pinned host memory fit in this host's physical RAM."""
    ram = host_ram_bytes()
    if ram is not None and nbytes > ram:
        raise ValueError(f"{name} needs {nbytes} bytes of pinned host memory, more than this host's RAM "
                         f"({ram} bytes): lower the budget")
