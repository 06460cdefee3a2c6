"""The communicator: the one owner of torch.distributed in the runtime (docs/solvers.md §6, docs/vendors.md §8).

Like Megatron's P2PCommunicator and ProcessGroupCollection together: a `Communicator` is
made once per process (`Communicator.start` joins the world), passed explicitly to the code
that talks to other ranks, and owns every send, receive and collective and the creation of
every process group (`new_group`). It knows where each rank runs — its plan device, machine
and GPU vendor (`RankPlace`) — and each `Group` carries its ranks' vendors.

Vendor routing (docs/vendors.md §8, HetCCL): no collective library spans NVIDIA and AMD, so a
group whose ranks hold both is made of one subgroup per vendor (`Group.parts`, on the world's
backend: gloo on CPU, nccl on CUDA, which is RCCL in a ROCm build) and the vendor leaders'
bridge group (`Group.bridge`, gloo over host memory). A collective over it runs inside each
vendor first and only the leaders talk over the bridge (all-reduce: reduce to the leader,
leaders exchange partials, broadcast back); point-to-point between the two vendors goes
over the bridge too. `BridgeMeter` counts the bytes this rank sends over the bridge, and
`time_collectives` has the collectives of chosen kinds over chosen groups (a stage's TP
all-reduces; a member's head-parallel all-to-alls and ZeRO-3 gathers) add their seconds to a
step's timer, each to its own phase: the traffic the cost model prices apart (T_tp, a2a,
Z), which otherwise hides inside the forward and backward times. No
single-backend call is ever made on a group that holds both vendors (`_handle` refuses it).
On CPU every backend is gloo and the vendors are labels, so all of this runs anywhere.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import timedelta

import torch
import torch.distributed as dist

from planner.hardware import Vendor
from runtime.communication import duplex
from runtime.communication.comm_types import (BridgeMeter, Group, PendingExchange, PendingSend, RankPlace, ReduceOpName,
                                TimedCollectives, Waiter, spans_vendors)
from runtime.config import WaitName
from runtime.host import threads_fit
from runtime.metrics.timing import PhaseTimer

__all__ = ["BridgeMeter", "Communicator", "Group", "PendingExchange", "PendingSend", "RankPlace", "ReduceOpName",
           "TimedCollectives", "Waiter", "spans_vendors"]

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
_COMBINE = {"sum": torch.add, "max": torch.maximum, "min": torch.minimum}
VENDOR_ORDER = (Vendor.nvidia, Vendor.amd, Vendor.other)  # order of a mixed group's vendor parts
BRIDGE_BACKEND = "gloo"  # docs/vendors.md §8: the bridge runs over host memory


def waits_awake(device: torch.device, world_size: int, wait: WaitName = "auto") -> bool:
    """Whether this rank polls its waits (`Waiter`): on CPU, while the threads of this
    host's ranks (LOCAL_WORLD_SIZE, as torchrun and the local launchers set it; else every
    rank) fit in the cores this process may use. On a shared core a polling rank takes the
    time slices its neighbours' compute and gloo threads need: six ranks polling on two
    cores made the routed-collectives test time out, where asleep it takes seconds.
    `wait` "asleep" (RunConfig.wait): never, for cores shared with other work on purpose."""
    if device.type != "cpu" or wait == "asleep":
        return False
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return threads_fit(local, torch.get_num_threads())


@dataclass(frozen=True)
class Communicator:
    """This process's rank in the world and every operation it exchanges with other ranks."""

    rank: int
    world_size: int
    places: tuple[RankPlace, ...]  # by rank
    timeout_s: float
    device: torch.device
    world_group: Group | None = None  # set by `start` when the world spans vendors
    meter: BridgeMeter = field(default_factory=BridgeMeter)
    timed: list[TimedCollectives] = field(default_factory=list)  # see time_collectives
    poll: bool = False  # wait for operations awake (see Waiter); `start` decides (waits_awake)

    @classmethod
    def start(cls, backend: str, address: str | None, port: int | str | None, rank: int, world_size: int,
              places: tuple[RankPlace, ...], timeout_s: float, device: torch.device,
              wait: WaitName = "auto") -> Communicator:
        """Join the world (every rank calls this once, before any other operation): through
        a store at tcp://address:port (rank 0 hosts it), or, with `port` None, through the
        `env://` rendezvous (MASTER_ADDR/MASTER_PORT; under torchrun, the agent's store).
        A world over both vendors gets gloo beside nccl (bridge tensors are on the host) and
        its vendor parts and bridge, made here so that every rank makes them first. `wait`:
        see waits_awake ("asleep": never poll)."""
        init_method = "env://" if port is None else f"tcp://{address}:{port}"
        mixed = spans_vendors(p.vendor for p in places)
        if mixed and backend != BRIDGE_BACKEND:
            backend = f"cpu:{BRIDGE_BACKEND},cuda:{backend}"
        # A CUDA rank names its GPU: NCCL otherwise guesses it from the global rank (warning
        # that a heterogeneous rank-to-GPU mapping can hang), which is wrong under torchrun.
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)
        comm = cls(rank, world_size, tuple(places), timeout_s, device, poll=waits_awake(device, world_size, wait))
        return replace(comm, world_group=comm._mixed_group(tuple(range(world_size)), None)) if mixed else comm

    def close(self) -> None:
        """Wait for every rank, then leave the world cleanly."""
        self.barrier()
        dist.destroy_process_group()

    def time_collectives(self, timer: PhaseTimer, phases: dict[str, tuple[Group | None, tuple[str, ...]]]) -> None:
        """From now on (until the next call) each collective of the named kinds over the
        group of a phase (that very group, not another over the same ranks; None: none)
        adds its seconds to that phase of `timer`: {phase: (group, kinds)}."""
        self.timed[:] = [TimedCollectives(group, kinds, timer, phase) for phase, (group, kinds) in phases.items()
                         if group is not None]

    @property
    def waiter(self) -> Waiter:
        """How this rank waits for a collective: polled where `poll` (a collective's work
        reports its completion as it happens)."""
        return Waiter(self.timeout_s, self.poll)

    @property
    def message_waiter(self) -> Waiter:
        """How this rank waits for a point-to-point message: never polled. gloo's send and
        receive works report completion only once waited on (torch 2.13: `is_completed()` is
        still False 0.3 s after both sides finished), so a poll spun its whole SPIN_S on every
        message — on every stage-to-stage exchange of a pipeline, every send awaited at a
        step's end, every ring step. On CUDA nothing is polled anyway."""
        return Waiter(self.timeout_s, poll=False)

    def _call(self, collective, /, *args, **kwargs) -> None:
        """Run one torch.distributed collective to completion; every collective of this
        layer goes through here. Polled (CPU): posted, then awaited awake (`Waiter`).
        Otherwise the blocking call itself, bounded by its group's timeout."""
        if not self.poll:
            collective(*args, **kwargs)
            return
        work = collective(*args, async_op=True, **kwargs)
        if work is not None:  # None: this rank is not in the group, and torch did nothing
            self.waiter.finish(work, f"{collective.__name__} on rank {self.rank}")

    def _timing(self, group: Group, kind: str) -> AbstractContextManager:
        return next((t.timer.phase(t.phase) for t in self.timed if t.group is group and kind in t.kinds),
                    nullcontext())

    # -- where ranks run ------------------------------------------------------------------
    def vendor_of(self, rank: int) -> Vendor:
        return self.places[rank].vendor

    def machine_of(self, rank: int) -> int | None:
        return self.places[rank].machine

    @property
    def world(self) -> Group:
        if self.world_group is not None:
            return self.world_group
        ranks = tuple(range(self.world_size))
        return Group(ranks, tuple(self.vendor_of(r) for r in ranks), None)

    def crosses(self, other: int) -> bool:
        """Whether a message between this rank and `other` crosses the bridge."""
        return spans_vendors((self.vendor_of(self.rank), self.vendor_of(other)))

    # -- groups ---------------------------------------------------------------------------
    def new_group(self, ranks: tuple[int, ...]) -> Group:
        """Create a process group. Every rank must call this for every group, in one order,
        even for groups it is not part of; this is the runtime's only group creation. A group
        over both vendors is made of its vendor parts and their leaders' bridge."""
        ranks = tuple(ranks)
        vendors = tuple(self.vendor_of(r) for r in ranks)
        if spans_vendors(vendors):
            return self._mixed_group(ranks, None)
        return Group(ranks, vendors, self._make(ranks))

    def _make(self, ranks: tuple[int, ...], backend: str | None = None) -> object:
        return dist.new_group(ranks=list(ranks), timeout=timedelta(seconds=self.timeout_s), backend=backend)

    def _mixed_group(self, ranks: tuple[int, ...], handle: object | None) -> Group:
        """One subgroup per vendor on the world's backend, then the leaders' bridge on gloo,
        created in this order on every rank. Ranks in ascending order: torch's group order,
        which all-gather and reduce-scatter blocks follow."""
        ranks = tuple(sorted(ranks))
        vendors = tuple(self.vendor_of(r) for r in ranks)
        parts = []
        for vendor in VENDOR_ORDER:
            own = tuple(r for r, v in zip(ranks, vendors) if v == vendor)
            if own:
                parts.append(Group(own, (vendor,) * len(own), self._make(own)))
        leaders = tuple(p.ranks[0] for p in parts)
        bridge = Group(leaders, tuple(p.vendors[0] for p in parts), self._make(leaders, BRIDGE_BACKEND),
                       is_bridge=True)
        return Group(ranks, vendors, handle, tuple(parts), bridge)

    @staticmethod
    def _handle(group: Group) -> object | None:
        """The backend handle of a single-backend group. Refuses a group that holds both
        vendors (no collective library spans them, docs/vendors.md §8), bar the leaders' bridge."""
        if group.mixes_vendors and not group.is_bridge:
            raise RuntimeError(f"a single-backend collective over ranks {list(group.ranks)} would span "
                               f"nvidia and amd; such groups are routed through their vendor parts")
        return group.handle

    def _direct(self, tensor: torch.Tensor, ranks: tuple[int, ...]) -> bool:
        """Whether a message or collective of `tensor` among `ranks` runs as chunks posted both
        ways at once (`duplex`) rather than the backend's own: on host tensors (gloo's) between
        ranks on different machines, where gloo's own ran one direction at a time (1.5–2.1× one
        way, runtime/README.md). Inside a machine gloo's own stay: their collectives can be
        polled awake (`_call`), which point-to-point works cannot; nccl's are left to nccl."""
        machines = {self.machine_of(r) for r in ranks}
        return tensor.device.type == "cpu" and None not in machines and len(machines) > 1

    def _host(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` itself on the host, else a pinned host copy: the bridge runs over host memory."""
        if tensor.device.type == "cpu":
            return tensor
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        return host.copy_(tensor)

    # -- point to point -------------------------------------------------------------------
    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> PendingSend:
        """Post a non-blocking send of `tensor` (detached, contiguous) to rank `dst`; to a
        rank of the other vendor from host memory, over the bridge."""
        return self.exchange([(tensor, dst)], [], tag).sends[0]

    def recv(self, buffer: torch.Tensor, src: int, tag: int) -> torch.Tensor:
        """Receive into `buffer` from rank `src`, waiting at most the timeout."""
        self.exchange([], [(buffer, src)], tag).wait()
        return buffer

    def exchange(self, sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]],
                 tag: int) -> PendingExchange:
        """Many point-to-point messages at once: post every send (tensor, dst rank) and every
        receive (buffer, src rank, filled in place) and return at once; `wait()` on the result
        before reading the buffers. Posting everything before waiting is what keeps a ring
        from deadlocking, and what lets it overlap the transfer with compute. Host tensors
        between machines travel in chunks (`_direct`, `duplex.post`), so that the two ways of
        a link carry at once; `tag` must be below duplex.MESSAGE_TAGS."""
        if not 0 <= tag < duplex.MESSAGE_TAGS:
            raise ValueError(f"message tag {tag} is outside 0..{duplex.MESSAGE_TAGS - 1}")
        payloads = [(self._outgoing(tensor, dst), dst) for tensor, dst in sends]
        landings = [(self._host(buffer) if self.crosses(src) else buffer, buffer, src) for buffer, src in recvs]
        send_chunked = [self._direct(p, (self.rank, d)) for p, d in payloads]
        recv_chunked = [self._direct(l, (self.rank, s)) for l, _, s in landings]
        sent, received = map(iter, duplex.post([m for m, c in zip(payloads, send_chunked) if c],
                                               [(l, s) for (l, _, s), c in zip(landings, recv_chunked) if c], tag=tag))
        return PendingExchange(
            sends=[PendingSend(next(sent) if c else [dist.isend(p, dst=d, tag=tag)], p, d, self.message_waiter)
                   for (p, d), c in zip(payloads, send_chunked)],
            recvs=[(next(received) if c else [dist.irecv(l, src=s, tag=tag)], s)
                   for (l, _, s), c in zip(landings, recv_chunked)],
            waiter=self.message_waiter,
            staged=[(landing, buffer) for landing, buffer, _ in landings if landing is not buffer])

    def _outgoing(self, tensor: torch.Tensor, dst: int) -> torch.Tensor:
        """What is sent of `tensor`: detached and contiguous; to the other vendor, on the host
        (counted by the bridge meter)."""
        payload = tensor.detach().contiguous()
        if self.crosses(dst):
            payload = self._host(payload)
            self.meter.sent += payload.numel() * payload.element_size()
        return payload

    # -- collectives ----------------------------------------------------------------------
    def broadcast(self, tensor: torch.Tensor, src: int, group: Group) -> torch.Tensor:
        """In place: every rank of `group` ends with rank `src`'s `tensor`."""
        if not group.parts:
            self._call(dist.broadcast, tensor, src=src, group=self._handle(group))
            return tensor
        origin, part = group.part_of(src), group.part_of(self.rank)
        if part is origin and part.size > 1:
            self._call(dist.broadcast, tensor, src=src, group=self._handle(part))
        self._bridge_broadcast(tensor, origin.ranks[0], group)
        if part is not origin and part.size > 1:
            self._call(dist.broadcast, tensor, src=part.ranks[0], group=self._handle(part))
        return tensor

    def _bridge_broadcast(self, tensor: torch.Tensor, root: int, group: Group) -> None:
        """Leader `root` sends `tensor` to the other leaders of `group` over the bridge."""
        if self.rank not in group.bridge.ranks:
            return
        host = self._host(tensor)
        self._call(dist.broadcast, host, src=root, group=self._handle(group.bridge))
        if self.rank == root:
            self.meter.sent += (group.bridge.size - 1) * host.numel() * host.element_size()
        elif host is not tensor:
            tensor.copy_(host)

    def _bridge_all_gather(self, tensor: torch.Tensor, group: Group) -> list[torch.Tensor]:
        """Every leader's `tensor`, in part order, from host memory: each leader sends its own
        to every other in chunks, all posted at once (`duplex.all_gather`), so that the bridge's
        link carries both ways together, as docs/vendors.md §8 prices the exchange (an
        all-reduce: x/bw)."""
        host = self._host(tensor.contiguous())
        out = duplex.all_gather(host, group.bridge.ranks, self.rank, handle=self._handle(group.bridge),
                                waiter=self.message_waiter)
        self.meter.sent += (group.bridge.size - 1) * host.numel() * host.element_size()
        return [o.to(tensor.device) for o in out]

    def all_reduce(self, tensor: torch.Tensor, group: Group, op: ReduceOpName = "sum") -> torch.Tensor:
        """In place: `tensor` becomes the reduction over the ranks of `group`. Over both
        vendors: reduced to each vendor's leader, the leaders' partials exchanged over the
        bridge and combined in part order (so every leader gets the same bits), then broadcast
        back inside each vendor."""
        with self._timing(group, "all_reduce"):
            return self._all_reduce(tensor, group, op)

    def _all_reduce(self, tensor: torch.Tensor, group: Group, op: ReduceOpName) -> torch.Tensor:
        if not group.parts:
            self._call(dist.all_reduce, tensor, op=_REDUCE_OPS[op], group=self._handle(group))
            return tensor
        part = group.part_of(self.rank)
        leader = part.ranks[0]
        if part.size > 1:
            self._call(dist.reduce, tensor, dst=leader, op=_REDUCE_OPS[op], group=self._handle(part))
        if self.rank == leader:
            partials = self._bridge_all_gather(tensor, group)
            combined = partials[0]
            for partial in partials[1:]:
                combined = _COMBINE[op](combined, partial)
            tensor.copy_(combined)
        if part.size > 1:
            self._call(dist.broadcast, tensor, src=leader, group=self._handle(part))
        return tensor

    def all_gather(self, tensor: torch.Tensor, group: Group) -> list[torch.Tensor]:
        """Every rank's `tensor`, in the group's rank order. Over both vendors: gathered
        inside each vendor, then each leader sends its vendor's blocks to the other leaders
        over the bridge, and they are broadcast inside each vendor."""
        with self._timing(group, "all_gather"):
            return self._all_gather(tensor, group)

    def _all_gather(self, tensor: torch.Tensor, group: Group) -> list[torch.Tensor]:
        if not group.parts:
            if self._direct(tensor, group.ranks):
                return duplex.all_gather(tensor, group.ranks, self.rank, handle=self._handle(group),
                                         waiter=self.message_waiter)
            out = [torch.empty_like(tensor) for _ in group.ranks]
            self._call(dist.all_gather, out, tensor.contiguous(), group=self._handle(group))
            return out
        part = group.part_of(self.rank)
        mine = [torch.empty_like(tensor) for _ in part.ranks]
        self._call(dist.all_gather, mine, tensor.contiguous(), group=self._handle(part))
        blocks = dict(zip(part.ranks, mine))
        for other in group.parts:
            stacked = torch.stack(mine) if other is part else tensor.new_empty((other.size, *tensor.shape))
            self._bridge_broadcast(stacked, other.ranks[0], group)
            if other is not part:
                if part.size > 1:
                    self._call(dist.broadcast, stacked, src=part.ranks[0], group=self._handle(part))
                blocks.update(zip(other.ranks, stacked.unbind(0)))
        return [blocks[r] for r in group.ranks]

    def reduce_scatter(self, tensor: torch.Tensor, group: Group) -> torch.Tensor:
        """The sum over the ranks of `group` of this rank's block of `tensor` (dim 0 cut into
        group.size equal blocks, in the group's rank order); ZeRO-3's gradient collective.
        Over both vendors: summed to each vendor's leader, each vendor's blocks summed over
        the bridge at its leader, then broadcast inside the vendor."""
        with self._timing(group, "reduce_scatter"):
            return self._reduce_scatter(tensor, group)

    def _reduce_scatter(self, tensor: torch.Tensor, group: Group) -> torch.Tensor:
        size = tensor.shape[0] // group.size
        if not group.parts:
            if self._direct(tensor, group.ranks):
                return duplex.reduce_scatter(tensor, group.ranks, self.rank, handle=self._handle(group),
                                             waiter=self.message_waiter)
            out = tensor.new_empty(size, *tensor.shape[1:])
            self._call(dist.reduce_scatter_single, out, tensor.detach().contiguous(), group=self._handle(group))
            return out
        part = group.part_of(self.rank)
        total = tensor.detach().clone().contiguous()
        if part.size > 1:
            self._call(dist.reduce, total, dst=part.ranks[0], group=self._handle(part))
        block = {r: total.narrow(0, i * size, size) for i, r in enumerate(group.ranks)}
        for other in group.parts:
            blocks = torch.cat([block[r] for r in other.ranks])
            if self.rank in group.bridge.ranks:
                self._bridge_reduce(blocks, other.ranks[0], group)
            if other is part:
                if part.size > 1:
                    self._call(dist.broadcast, blocks, src=part.ranks[0], group=self._handle(part))
                out = blocks.narrow(0, part.ranks.index(self.rank) * size, size).clone()
        return out

    def _bridge_reduce(self, tensor: torch.Tensor, root: int, group: Group) -> None:
        """In place at leader `root`: the sum of every leader's `tensor`, over the bridge."""
        host = self._host(tensor)
        self._call(dist.reduce, host, dst=root, group=self._handle(group.bridge))
        if self.rank != root:
            self.meter.sent += host.numel() * host.element_size()
        elif host is not tensor:
            tensor.copy_(host)

    def all_to_all(self, tensor: torch.Tensor, *, send_sizes: list[int], recv_sizes: list[int],
                   group: Group) -> torch.Tensor:
        """Uneven all-to-all of a 1-D `tensor` over `group` (ranks in ascending order): the
        group's j-th rank gets the j-th run of `send_sizes[j]` elements; the result holds,
        in group order, `recv_sizes[j]` elements from the j-th rank. HP groups never span
        vendors (docs/sequence-plans.md §7.1 rule 2), so a group that does is refused."""
        if len(send_sizes) != group.size or len(recv_sizes) != group.size or sum(send_sizes) != tensor.numel():
            raise ValueError(f"all_to_all over {group.size} ranks: sizes {send_sizes} / {recv_sizes} "
                             f"for {tensor.numel()} elements")
        with self._timing(group, "all_to_all"):
            if self._direct(tensor, group.ranks):
                return duplex.all_to_all(tensor, group.ranks, self.rank, send_sizes=list(send_sizes),
                                         recv_sizes=list(recv_sizes), handle=self._handle(group),
                                         waiter=self.message_waiter)
            out = tensor.new_empty(sum(recv_sizes))
            self._call(dist.all_to_all_single, out, tensor.detach().contiguous(), output_split_sizes=list(recv_sizes),
                       input_split_sizes=list(send_sizes), group=self._handle(group))
        return out

    def barrier(self) -> None:
        """Every rank waits for every other (over the vendor parts and the bridge when the
        world spans vendors: no single-backend barrier over both)."""
        if self.world_group is None:
            self._call(dist.barrier)
        else:
            self.all_reduce(torch.zeros(1, device=self.device), self.world_group)
