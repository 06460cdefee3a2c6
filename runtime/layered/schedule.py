"""Running a schedule on one stage, and the stage-to-stage exchange.

The order of a stage's forward and backward passes comes from the planner's schedule
registry (`planner.schedules`: the schedule that was priced is the one that runs);
`StepRunner.run` executes its actions.

Only stage leaders talk across stages: the sender's leader posts a non-blocking send of the
activation (or gradient), the receiver's leader waits for it — bounded by the timeout — and
broadcasts it in its TP group. Sends are non-blocking so that the two sides of a link may
order their sends and receives differently (1F1B's steady state does) without deadlock;
they are awaited at the end of the step. Every exchange goes through the communicator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from planner.schedules import Pass, Schedule
from runtime.communication.communicator import Communicator, PendingSend
from runtime.layered.groups import RankGroups
from runtime.layered.stage import StageModel
from runtime.metrics.timing import BACKWARD, COMM, FORWARD, PhaseTimer

FORWARD_TAG, BACKWARD_TAG = 0, 1


@dataclass
class StageLink:
    """The leader-to-leader exchange of one stage with its neighbours in the pipeline."""

    comm: Communicator
    groups: RankGroups
    shape: tuple[int, ...]
    prev_leader: int | None
    next_leader: int | None
    pending: list[PendingSend] = field(default_factory=list)

    @classmethod
    def of(cls, comm: Communicator, groups: RankGroups, shape: tuple[int, ...]) -> StageLink:
        pipeline = groups.layout.pipeline_stages(groups.stage.pipeline)
        k = groups.stage.stage
        return cls(comm, groups, shape, pipeline[k - 1].leader if k > 0 else None,
                   pipeline[k + 1].leader if k + 1 < len(pipeline) else None)

    def _receive(self, src: int, tag: int) -> torch.Tensor:
        buf = torch.empty(self.shape, device=self.comm.device)
        if self.groups.is_leader:
            self.comm.recv(buf, src, tag)
        if self.groups.tp is not None:
            self.comm.broadcast(buf, self.groups.stage.leader, self.groups.tp)
        return buf

    def _send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        if self.groups.is_leader:
            self.pending.append(self.comm.send(tensor, dst, tag))

    def recv_forward(self) -> torch.Tensor:
        return self._receive(self.prev_leader, FORWARD_TAG).requires_grad_()

    def send_forward(self, hidden: torch.Tensor) -> None:
        self._send(hidden, self.next_leader, FORWARD_TAG)

    def recv_backward(self) -> torch.Tensor:
        return self._receive(self.next_leader, BACKWARD_TAG)

    def send_backward(self, grad: torch.Tensor) -> None:
        self._send(grad, self.prev_leader, BACKWARD_TAG)

    def finish(self) -> None:
        for send in self.pending:
            send.wait()
        self.pending.clear()


@dataclass
class StepRunner:
    """Runs one step's micro-batches through this rank's stage under a schedule."""

    model: StageModel
    link: StageLink
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
