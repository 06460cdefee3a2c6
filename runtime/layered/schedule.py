"""Running a schedule on one stage, and the stage-to-stage exchange.

The order of a stage's forward and backward passes comes from the planner's schedule
registry (`planner.schedules`: the schedule that was priced is the one that runs);
`StepRunner.run` executes its actions.

Only stage leaders talk across stages: the sender's leader posts a non-blocking send of the
activation (or gradient), the receiver's leader waits for it — bounded by the timeout — and
broadcasts it in its TP group. Sends are non-blocking so that the two sides of a link may
order their sends and receives differently (1F1B's steady state does) without deadlock;
they are awaited at the end of the step. Every exchange goes through the communicator.

With sequence parallelism (`SplitStageLink`) each rank holds its 1/t of the sequence at a
stage boundary, so the boundary is exchanged in that split form: every rank of the sending
stage sends each rank of the receiving stage the tokens both hold — a TP-2 → TP-2 boundary is
two messages of A/2 in parallel, TP-2 → TP-1 two halves into one rank — and no broadcast.
`make_link` picks the link of the stage's model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from planner.schedules import Pass, Schedule
from runtime.communication.communicator import Communicator, PendingSend
from runtime.layered.groups import RankGroups
from runtime.layered.layout import StageRanks
from runtime.layered.stage import StageModel
from runtime.metrics.timing import BACKWARD, COMM, FORWARD, PhaseTimer

FORWARD_TAG, BACKWARD_TAG = 0, 1


class DirectedExchanges:
    """The four exchanges of a stage with its neighbours and the wait at the end of a step, on
    top of a link's own `_receive(peer, tag)` and `_send(tensor, peer, tag)` with its `prev` and
    `next` peers (a leader's rank, or the neighbouring stage's ranks)."""

    def recv_forward(self) -> torch.Tensor:
        return self._receive(self.prev, FORWARD_TAG).requires_grad_()

    def send_forward(self, hidden: torch.Tensor) -> None:
        self._send(hidden, self.next, FORWARD_TAG)

    def recv_backward(self) -> torch.Tensor:
        return self._receive(self.next, BACKWARD_TAG)

    def send_backward(self, grad: torch.Tensor) -> None:
        self._send(grad, self.prev, BACKWARD_TAG)

    def finish(self) -> None:
        for send in self.pending:
            send.wait()
        self.pending.clear()


@dataclass
class StageLink(DirectedExchanges):
    """The leader-to-leader exchange of one stage with its neighbours in the pipeline."""

    comm: Communicator
    groups: RankGroups
    shape: tuple[int, ...]
    prev: int | None  # the previous stage's leader (None: first stage)
    next: int | None  # the next stage's leader (None: last stage)
    pending: list[PendingSend] = field(default_factory=list)
    dtype: torch.dtype = torch.float32  # the activations' (the weights') dtype

    @classmethod
    def of(cls, comm: Communicator, groups: RankGroups, shape: tuple[int, ...],
           dtype: torch.dtype = torch.float32) -> StageLink:
        pipeline = groups.layout.pipeline_stages(groups.stage.pipeline)
        k = groups.stage.stage
        return cls(comm, groups, shape, pipeline[k - 1].leader if k > 0 else None,
                   pipeline[k + 1].leader if k + 1 < len(pipeline) else None, dtype=dtype)

    def _receive(self, src: int, tag: int) -> torch.Tensor:
        buf = torch.empty(self.shape, device=self.comm.device, dtype=self.dtype)
        if self.groups.is_leader:
            self.comm.recv(buf, src, tag)
        if self.groups.tp is not None:
            self.comm.broadcast(buf, self.groups.stage.leader, self.groups.tp)
        return buf

    def _send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        if self.groups.is_leader:
            self.pending.append(self.comm.send(tensor, dst, tag))



def sequence_spans(stage: StageRanks, seq_len: int) -> list[tuple[int, int, int]]:
    """(rank, first token, end) of each rank's part of the sequence under sequence parallelism."""
    part = seq_len // stage.tp
    return [(rank, i * part, (i + 1) * part) for i, rank in enumerate(stage.ranks)]


@dataclass
class SplitStageLink(DirectedExchanges):
    """Sequence parallelism's boundary: each rank exchanges its tokens with the ranks of the
    neighbouring stage that hold them (`shape` is the whole micro-batch's [b, s, h])."""

    comm: Communicator
    groups: RankGroups
    shape: tuple[int, ...]
    prev: StageRanks | None
    next: StageRanks | None
    dtype: torch.dtype = torch.float32
    pending: list[PendingSend] = field(default_factory=list)

    @classmethod
    def of(cls, comm: Communicator, groups: RankGroups, shape: tuple[int, ...], dtype: torch.dtype) -> SplitStageLink:
        pipeline = groups.layout.pipeline_stages(groups.stage.pipeline)
        k = groups.stage.stage
        return cls(comm, groups, shape, pipeline[k - 1] if k > 0 else None,
                   pipeline[k + 1] if k + 1 < len(pipeline) else None, dtype=dtype)

    def _overlaps(self, other: StageRanks) -> list[tuple[int, int, int]]:
        """(other rank, first, end) of the tokens this rank shares with each rank of `other`,
        relative to this rank's own first token, in token order."""
        seq_len = self.shape[1]
        _, lo, hi = next(span for span in sequence_spans(self.groups.stage, seq_len) if span[0] == self.comm.rank)
        return [(rank, max(lo, a) - lo, min(hi, b) - lo) for rank, a, b in sequence_spans(other, seq_len)
                if max(lo, a) < min(hi, b)]

    def _receive(self, other: StageRanks, tag: int) -> torch.Tensor:
        b, _, *rest = self.shape
        pieces = [(torch.empty((b, end - start, *rest), device=self.comm.device, dtype=self.dtype), rank)
                  for rank, start, end in self._overlaps(other)]
        self.comm.exchange([], pieces, tag).wait()
        return torch.cat([piece for piece, _ in pieces], dim=1)

    def _send(self, tensor: torch.Tensor, other: StageRanks, tag: int) -> None:
        for rank, start, end in self._overlaps(other):
            self.pending.append(self.comm.send(tensor[:, start:end], rank, tag))



def make_link(comm: Communicator, groups: RankGroups, model: StageModel, shape: tuple[int, ...]):
    """The boundary exchange of `model`'s stage: split by sequence under sequence parallelism
    (stages of TP 1 hold the whole sequence: one part), else leader to leader."""
    if model.split_boundaries:
        return SplitStageLink.of(comm, groups, shape, model.dtype)
    return StageLink.of(comm, groups, shape, model.dtype)


@dataclass
class StepRunner:
    """Runs one step's micro-batches through this rank's stage under a schedule."""

    model: StageModel
    link: StageLink | SplitStageLink
    micro_batches: list[tuple[torch.Tensor, torch.Tensor]]  # (inputs, labels) per micro-batch
    loss_scale: float  # 1 / tokens of the global batch
    timer: PhaseTimer = field(default_factory=PhaseTimer)  # forward, backward, comm (waits included)
    loss_sum: float = 0.0
    saved: dict = field(default_factory=dict)

    def forward(self, i: int) -> None:
        stage = self.model.stage
        inputs, labels = self.micro_batches[i]
        if stage.first:
            x = inputs
        else:
            with self.timer.phase(COMM):
                x = self.link.recv_forward()
        with self.timer.phase(FORWARD):
            out = self.model(x, labels if stage.last else None, self.loss_scale)
        if stage.last:
            self.loss_sum += out.item()
        else:
            with self.timer.phase(COMM):
                self.link.send_forward(out)
        self.saved[i] = (x, out)

    def backward(self, i: int) -> None:
        stage = self.model.stage
        x, out = self.saved.pop(i)
        grad = None
        if not stage.last:
            with self.timer.phase(COMM):
                grad = self.link.recv_backward()
        with self.timer.phase(BACKWARD):
            torch.autograd.backward(out, grad)
        if not stage.first:
            with self.timer.phase(COMM):
                self.link.send_backward(x.grad)

    def run(self, schedule: Schedule) -> None:
        """This stage's actions of `schedule` (planner.schedules), then await the sends."""
        stage = self.model.stage
        num_stages = len(self.link.groups.layout.pipeline_stages(stage.pipeline))
        passes = {Pass.forward: self.forward, Pass.backward: self.backward}
        for action in schedule.actions(num_stages, stage.stage, len(self.micro_batches)):
            passes[action.pass_](action.micro_batch)
        with self.timer.phase(COMM):
            self.link.finish()
