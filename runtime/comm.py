"""The communicator: the one owner of torch.distributed in the runtime (DESIGN.md §6, §8).

Like Megatron's P2PCommunicator and ProcessGroupCollection together: a `Communicator` is
made once per process (`Communicator.start` joins the world), passed explicitly to the code
that talks to other ranks, and owns every send, receive and collective and the creation of
every process group (`new_group`). It knows where each rank runs — its plan device, machine
and GPU vendor (`RankPlace`) — and each `Group` carries its ranks' vendors.

The seam of DESIGN.md §8: routing a collective by the vendors of its ranks (one vendor → its
backend; several → reduce inside each vendor, all-reduce among the vendor leaders over the
bridge, broadcast back; point-to-point across vendors over the bridge) changes the bodies
of `send`, `recv`, `broadcast`, `all_reduce` and `all_gather` here and nothing else. Today
every call goes to the one backend the world was started with.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

import torch
import torch.distributed as dist

from planner.hardware import Vendor

ReduceOpName = Literal["sum", "max", "min"]
_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


@dataclass(frozen=True)
class RankPlace:
    """Where one rank runs: its plan device, that device's machine and its GPU vendor
    (machine None and vendor `other` when the job carries no cluster)."""

    device: int
    machine: int | None = None
    vendor: Vendor = Vendor.other


@dataclass(frozen=True)
class Group:
    """A process group: its ranks, their vendors, and the backend's opaque handle."""

    ranks: tuple[int, ...]
    vendors: tuple[Vendor, ...]
    handle: object | None  # None: the default (world) group

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def mixes_vendors(self) -> bool:
        """True when the group holds both nvidia and amd ranks (DESIGN.md §8 bridge)."""
        return {Vendor.nvidia, Vendor.amd} <= set(self.vendors)


@dataclass
class PendingSend:
    """A posted non-blocking send; the payload is kept alive until it is awaited."""

    work: object
    payload: torch.Tensor
    timeout_s: float

    def wait(self) -> None:
        self.work.wait(timedelta(seconds=self.timeout_s))


@dataclass
class PendingExchange:
    """The posted sends and receives of one `Communicator.exchange`."""

    sends: list[PendingSend]
    recvs: list[tuple[object, int]]  # (work, src rank)
    timeout_s: float

    def wait(self) -> None:
        """Wait for every receive (each at most the timeout), then for every send."""
        for work, src in self.recvs:
            if not work.wait(timedelta(seconds=self.timeout_s)):
                raise TimeoutError(f"no message from rank {src} within {self.timeout_s:g} s")
        for send in self.sends:
            send.wait()


@dataclass(frozen=True)
class Communicator:
    """This process's rank in the world and every operation it exchanges with other ranks."""

    rank: int
    world_size: int
    places: tuple[RankPlace, ...]  # by rank
    timeout_s: float
    device: torch.device

    @classmethod
    def start(cls, backend: str, address: str | None, port: int | str | None, rank: int, world_size: int,
              places: tuple[RankPlace, ...], timeout_s: float, device: torch.device) -> Communicator:
        """Join the world (every rank calls this once, before any other operation): through
        a store at tcp://address:port (rank 0 hosts it), or, with `port` None, through the
        `env://` rendezvous (MASTER_ADDR/MASTER_PORT; under torchrun, the agent's store)."""
        init_method = "env://" if port is None else f"tcp://{address}:{port}"
        dist.init_process_group(backend, init_method=init_method, rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=timeout_s))
        return cls(rank, world_size, tuple(places), timeout_s, device)

    def close(self) -> None:
        """Wait for every rank, then leave the world cleanly."""
        self.barrier()
        dist.destroy_process_group()

    # -- where ranks run ------------------------------------------------------------------
    def vendor_of(self, rank: int) -> Vendor:
        return self.places[rank].vendor

    def machine_of(self, rank: int) -> int | None:
        return self.places[rank].machine

    @property
    def world(self) -> Group:
        ranks = tuple(range(self.world_size))
        return Group(ranks, tuple(self.vendor_of(r) for r in ranks), None)

    # -- groups ---------------------------------------------------------------------------
    def new_group(self, ranks: tuple[int, ...]) -> Group:
        """Create a process group. Every rank must call this for every group, in one order,
        even for groups it is not part of; this is the runtime's only `new_group` call."""
        handle = dist.new_group(ranks=list(ranks), timeout=timedelta(seconds=self.timeout_s))
        return Group(tuple(ranks), tuple(self.vendor_of(r) for r in ranks), handle)

    # -- point to point -------------------------------------------------------------------
    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> PendingSend:
        """Post a non-blocking send of `tensor` (detached, contiguous) to rank `dst`."""
        payload = tensor.detach().contiguous()
        return PendingSend(dist.isend(payload, dst=dst, tag=tag), payload, self.timeout_s)

    def recv(self, buffer: torch.Tensor, src: int, tag: int) -> torch.Tensor:
        """Receive into `buffer` from rank `src`, waiting at most the timeout."""
        work = dist.irecv(buffer, src=src, tag=tag)
        if not work.wait(timedelta(seconds=self.timeout_s)):
            raise TimeoutError(f"no message from rank {src} within {self.timeout_s:g} s")
        return buffer

    def exchange(self, sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]],
                 tag: int) -> PendingExchange:
        """Many point-to-point messages at once: post every send (tensor, dst rank) and every
        receive (buffer, src rank, filled in place) and return at once; `wait()` on the result
        before reading the buffers. Posting everything before waiting is what keeps a ring
        from deadlocking, and what lets it overlap the transfer with compute."""
        return PendingExchange(
            sends=[self.send(tensor, dst, tag) for tensor, dst in sends],
            recvs=[(dist.irecv(buffer, src=src, tag=tag), src) for buffer, src in recvs],
            timeout_s=self.timeout_s)

    # -- collectives ----------------------------------------------------------------------
    def broadcast(self, tensor: torch.Tensor, src: int, group: Group) -> torch.Tensor:
        """In place: every rank of `group` ends with rank `src`'s `tensor`."""
        dist.broadcast(tensor, src=src, group=group.handle)
        return tensor

    def all_reduce(self, tensor: torch.Tensor, group: Group, op: ReduceOpName = "sum") -> torch.Tensor:
        """In place: `tensor` becomes the reduction over the ranks of `group`."""
        dist.all_reduce(tensor, op=_REDUCE_OPS[op], group=group.handle)
        return tensor

    def all_gather(self, tensor: torch.Tensor, group: Group) -> list[torch.Tensor]:
        """Every rank's `tensor`, in the group's rank order."""
        out = [torch.empty_like(tensor) for _ in group.ranks]
        dist.all_gather(out, tensor.contiguous(), group=group.handle)
        return out

    def reduce_scatter(self, tensor: torch.Tensor, group: Group) -> torch.Tensor:
        """The sum over the ranks of `group` of this rank's block of `tensor` (dim 0 cut into
        group.size equal blocks, in the group's rank order); ZeRO-3's gradient collective."""
        out = tensor.new_empty(tensor.shape[0] // group.size, *tensor.shape[1:])
        dist.reduce_scatter_tensor(out, tensor.detach().contiguous(), group=group.handle)
        return out

    def all_to_all(self, tensor: torch.Tensor, *, send_sizes: list[int], recv_sizes: list[int],
                   group: Group) -> torch.Tensor:
        """Uneven all-to-all of a 1-D `tensor` over `group` (ranks in ascending order): the
        group's j-th rank gets the j-th run of `send_sizes[j]` elements; the result holds,
        in group order, `recv_sizes[j]` elements from the j-th rank."""
        if len(send_sizes) != group.size or len(recv_sizes) != group.size or sum(send_sizes) != tensor.numel():
            raise ValueError(f"all_to_all over {group.size} ranks: sizes {send_sizes} / {recv_sizes} "
                             f"for {tensor.numel()} elements")
        out = tensor.new_empty(sum(recv_sizes))
        dist.all_to_all_single(out, tensor.detach().contiguous(), output_split_sizes=list(recv_sizes),
                               input_split_sizes=list(send_sizes), group=group.handle)
        return out

    def barrier(self) -> None:
        dist.barrier()
