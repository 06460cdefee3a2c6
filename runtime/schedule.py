"""Pipeline schedules (1F1B, GPipe) and the stage-to-stage exchange.

Only stage leaders talk across stages: the sender's leader posts a non-blocking send of the
activation (or gradient), the receiver's leader waits for it — bounded by the timeout — and
broadcasts it in its TP group. Sends are non-blocking so that the two sides of a link may
order their sends and receives differently (1F1B's steady state does) without deadlock;
they are awaited at the end of the step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from runtime.groups import RankGroups
from runtime.stage import StageModel

FORWARD_TAG, BACKWARD_TAG = 0, 1


@dataclass
class StageLink:
    """The leader-to-leader exchange of one stage with its neighbours in the pipeline."""

    groups: RankGroups
    shape: tuple[int, ...]
    timeout_s: float
    device: torch.device
    prev_leader: int | None
    next_leader: int | None
    pending: list = field(default_factory=list)

    @classmethod
    def of(cls, groups: RankGroups, shape: tuple[int, ...], timeout_s: float,
           device: torch.device) -> StageLink:
        pipeline = groups.layout.pipeline_stages(groups.stage.pipeline)
        k = groups.stage.stage
        return cls(groups, shape, timeout_s, device, pipeline[k - 1].leader if k > 0 else None,
                   pipeline[k + 1].leader if k + 1 < len(pipeline) else None)

    def _receive(self, src: int, tag: int) -> torch.Tensor:
        buf = torch.empty(self.shape, device=self.device)
        if self.groups.is_leader:
            work = dist.irecv(buf, src=src, tag=tag)
            if not work.wait(timedelta(seconds=self.timeout_s)):
                raise TimeoutError(f"no message from rank {src} within {self.timeout_s:g} s")
        if self.groups.tp is not None:
            dist.broadcast(buf, src=self.groups.stage.leader, group=self.groups.tp)
        return buf

    def _send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        if self.groups.is_leader:
            payload = tensor.detach().contiguous()
            self.pending.append((dist.isend(payload, dst=dst, tag=tag), payload))

    def recv_forward(self) -> torch.Tensor:
        return self._receive(self.prev_leader, FORWARD_TAG).requires_grad_()

    def send_forward(self, hidden: torch.Tensor) -> None:
        self._send(hidden, self.next_leader, FORWARD_TAG)

    def recv_backward(self) -> torch.Tensor:
        return self._receive(self.next_leader, BACKWARD_TAG)

    def send_backward(self, grad: torch.Tensor) -> None:
        self._send(grad, self.prev_leader, BACKWARD_TAG)

    def finish(self) -> None:
        for work, _ in self.pending:
            work.wait(timedelta(seconds=self.timeout_s))
        self.pending.clear()


@dataclass
class StageTimes:
    forward_s: float = 0.0
    backward_s: float = 0.0


@dataclass
class StepRunner:
    """Runs one step's micro-batches through this rank's stage under a schedule."""

    model: StageModel
    link: StageLink
    micro_batches: list[tuple[torch.Tensor, torch.Tensor]]  # (inputs, labels) per micro-batch
    loss_scale: float  # 1 / tokens of the global batch
    times: StageTimes = field(default_factory=StageTimes)
    loss_sum: float = 0.0
    saved: dict = field(default_factory=dict)

    def forward(self, i: int) -> None:
        stage = self.model.stage
        inputs, labels = self.micro_batches[i]
        x = inputs if stage.first else self.link.recv_forward()
        start = time.perf_counter()
        out = self.model(x, labels if stage.last else None, self.loss_scale)
        self.times.forward_s += time.perf_counter() - start
        if stage.last:
            self.loss_sum += out.item()
        else:
            self.link.send_forward(out)
        self.saved[i] = (x, out)

    def backward(self, i: int) -> None:
        stage = self.model.stage
        x, out = self.saved.pop(i)
        grad = None if stage.last else self.link.recv_backward()
        start = time.perf_counter()
        torch.autograd.backward(out, grad)
        self.times.backward_s += time.perf_counter() - start
        if not stage.first:
            self.link.send_backward(x.grad)

    def run(self, schedule: str) -> None:
        m = len(self.micro_batches)
        if schedule == "gpipe":
            order = [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
        else:
            order = one_f_one_b(m, len(self.link.groups.layout.pipeline_stages(self.model.stage.pipeline)),
                                self.model.stage.stage)
        for kind, i in order:
            (self.forward if kind == "F" else self.backward)(i)
        self.link.finish()


def one_f_one_b(micro_batches: int, num_stages: int, stage: int) -> list[tuple[str, int]]:
    """1F1B order of one stage: warm-up forwards, alternating F/B, cool-down backwards."""
    warmup = min(num_stages - stage - 1, micro_batches)
    order = [("F", i) for i in range(warmup)]
    for i in range(micro_batches - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(micro_batches - warmup, micro_batches)]
