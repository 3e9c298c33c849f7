"""The process groups of the MoP layout (DESIGN §2) and the ZeRO-2 handling of replicated shards.

Legend: ``W`` ranks, ``D`` sequence-parallel degree, ``E_p`` expert-parallel degree, ``P``
vocabulary group size, ``R = W/E_p`` (experts) or ``W/P`` (head) replicas of one shard,
``g_n`` a replicated parameter's full gradient (``n`` elements, flattened), ``c = ceil(n/R)``.

Groups (consecutive blocks, so ranks of one node share a group first): sequence groups
``{D·i … D·i+D-1}``, expert groups ``{E_p·i …}``, vocabulary groups ``{P·i …}``; the replicas of
expert shard ``j`` are ``{j, j+E_p, …}`` (of vocabulary shard ``j``: ``{j, j+P, …}``). Dense
weights are ZeRO-3 over all ``W`` through FSDP2 on a 1-D ``DeviceMesh``.

Replicated shards (experts, the head when ``P > 1``) are whole on every replica. After the
backward (all micro-steps), ``ReplicatedShards.reduce`` reduce-scatters each gradient over its
replicas (sum, padded to ``R·c``; then ``/W``, the same mean FSDP2 takes) into this replica's
``c``-slice, which the optimizer updates through a flat view of the parameter; ``gather``
all-gathers the updated slices back into the whole shard. Collectives per step and parameter:
one reduce-scatter and one all-gather of ``R·c`` elements over the replicas; transient device
buffers: the padded gradient ``R·c`` and the gathered ``R·c`` (one parameter at a time).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from planner.runtime import shim


@dataclass
class Groups:
    """This rank's groups and indices."""

    world: int
    rank: int
    seq: object
    expert: object
    expert_replicas: object
    vocab: object
    vocab_replicas: object
    mesh: object


def _blocks(W: int, size: int):
    return [list(range(i, i + size)) for i in range(0, W, size)]


def _strided(W: int, size: int):
    return [list(range(j, W, size)) for j in range(size)]


def make_groups(W: int, D: int, Ep: int, P: int, device_type: str) -> Groups:
    """Every rank calls this with the same degrees (each ``new_group`` is collective)."""
    from torch.distributed.device_mesh import init_device_mesh

    for name, d in (("seq_parallel", D), ("expert_parallel", Ep), ("vocab_parallel", P)):
        if W % d:
            raise ValueError(f"plan.composed.{name} ({d}) must divide world_size ({W})")
    if dist.get_world_size() != W:
        raise ValueError(f"plan.world_size ({W}) must equal the launched ranks ({dist.get_world_size()}); "
                         "fix: torchrun --nproc_per_node=W or a plan for this many ranks")
    rank = dist.get_rank()
    mesh = init_device_mesh(device_type, (W,))
    mine = {}
    for key, ranks_list in (("seq", _blocks(W, D)), ("expert", _blocks(W, Ep)),
                            ("expert_replicas", _strided(W, Ep)), ("vocab", _blocks(W, P)),
                            ("vocab_replicas", _strided(W, P))):
        for ranks in ranks_list:
            g = dist.new_group(ranks)
            if rank in ranks:
                mine[key] = g
    return Groups(W, rank, mesh=mesh, **mine)


class ReplicatedShards:
    """ZeRO-2 over the replicas of whole shards (module docstring).

    ``params``: ``[(param, replica_group), …]``. ``proxies`` are the flat slices the optimizer owns.
    """

    def __init__(self, params, world: int) -> None:
        self.items = []
        self.world = world
        for p, group in params:
            R, ri = shim.group_size(group), shim.group_rank(group)
            n = p.numel()
            c = -(-n // R)
            lo, hi = min(n, ri * c), min(n, (ri + 1) * c)
            proxy = p.detach().view(-1)[lo:hi]
            self.items.append((p, group, R, c, lo, hi, proxy))

    @property
    def proxies(self) -> list[torch.Tensor]:
        return [it[-1] for it in self.items if it[5] > it[4]]

    @property
    def gathers(self) -> bool:
        """Whether ``gather`` writes anything (some shard has replicas)."""
        return any(it[2] > 1 for it in self.items)

    @torch.no_grad()
    def reduce(self) -> None:
        """Reduce-scatter every gradient into its proxy's ``.grad`` (scaled by ``1/W``)."""
        for p, group, R, c, lo, hi, proxy in self.items:
            if p.grad is None:
                proxy.grad = None
                continue
            g_n = p.grad.reshape(-1)
            if R * c != g_n.numel():
                g_n = torch.nn.functional.pad(g_n, (0, R * c - g_n.numel()))
            out_c = g_n.new_empty(c)
            shim.reduce_scatter(out_c, g_n.contiguous(), group)
            del g_n
            proxy.grad = out_c[:hi - lo].div_(self.world) if hi > lo else None

    @torch.no_grad()
    def gather(self) -> None:
        """All-gather the updated slices into every replica's whole shard."""
        for p, group, R, c, lo, hi, proxy in self.items:
            if R == 1:
                continue
            mine_c = proxy.new_zeros(c)
            mine_c[:hi - lo].copy_(proxy)
            full = proxy.new_empty(R * c)
            shim.all_gather(full, mine_c, group)
            p.detach().view(-1).copy_(full[:p.numel()])

    def zero_grad(self) -> None:
        for it in self.items:
            it[-1].grad = None


class DenseShards:
    """The local shards of FSDP2's DTensor parameters, as plain leaf tensors for the optimizers
    (in-place updates land in FSDP2's sharded storage, which its all-gathers read)."""

    def __init__(self, params) -> None:
        self.pairs = []
        for p in params:
            with torch.no_grad():
                t = p.to_local().detach()
            if t.numel():
                self.pairs.append((p, t))

    @property
    def proxies(self) -> list[torch.Tensor]:
        return [t for _, t in self.pairs]

    def attach_grads(self) -> None:
        for p, t in self.pairs:
            if p.to_local().data_ptr() != t.data_ptr():
                raise RuntimeError("FSDP2 moved a parameter shard after the optimizer was built; fix: "
                                   "do not reassign parameters (load_state_dict(assign=True), .data =)")
            t.grad = None if p.grad is None else p.grad.to_local()

    def zero_grad(self) -> None:
        for _, t in self.pairs:
            t.grad = None
