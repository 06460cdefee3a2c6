"""Polish: with the structure fixed (pools, stages, order), move single layers between stages
of a pipeline and single micro-batches between pipelines while T drops (docs/cost-model.md §3.6),
or, where no move lowers T, while T stays and the pipelines' summed time drops (`slack_gain`).

A move is accepted only after the full evaluator (`planner.evaluate.breakdown`) prices it
and the memory bound holds. Small plans try every single move each round, so the result is a
true local optimum; large plans (hundreds of pipelines) screen moves with the cost model
first and only try those that touch the bottleneck: layer moves inside the slowest
pipelines, micro-batches out of them, and layers out of the stage with the longest DP sync.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from planner.layered import cost
from planner.layered.pricing import Breakdown, breakdown, stage_times
from planner.problem import Problem
from planner.layered.table import StageTable
from solvers.layered.heuristic.assemble import with_split

RELATIVE_GAIN = 1e-12  # a move must lower T by more than rounding noise
SLACK_GAIN = 1e-9  # a move that keeps T must lower Σ T_pipe by more than this share (`slack_gain`)
# plateau moves in a row before the polish stops: each costs a round of every move, and unbounded
# they cost gen-64 seed 2 1.4 % at `solve -t 10` (fewer structures in the time); h800-h20-16-24 needs one
PLATEAU_MOVES = 2


@dataclass(frozen=True)
class Move:
    kind: str  # "layer": one layer from stage src to stage dst; "batch": one micro-batch
    src: int  # stage index (layer) or pipeline index (batch)
    dst: int


def apply_move(layers: np.ndarray, micro: np.ndarray, move: Move) -> tuple[np.ndarray, np.ndarray]:
    layers, micro = layers.copy(), micro.copy()
    target = layers if move.kind == "layer" else micro
    target[move.src] -= 1
    target[move.dst] += 1
    return layers, micro


def all_moves(table: StageTable, layers: np.ndarray, micro: np.ndarray) -> list[Move]:
    """Every single move that keeps n ≥ 1 and m ≥ 1."""
    moves = []
    for p in range(table.num_pipelines):
        idx = range(table.pipe_start[p], table.pipe_start[p + 1])
        moves += [Move("layer", i, j) for i in idx for j in idx if i != j and layers[i] > 1]
    d = table.num_pipelines
    moves += [Move("batch", p, q) for p in range(d) for q in range(d) if p != q and micro[p] > 1]
    return moves


def count_moves(table: StageTable) -> int:
    sizes = np.diff(table.pipe_start)
    return int(np.sum(sizes * (sizes - 1))) + table.num_pipelines * (table.num_pipelines - 1)


def slack_gain(before: Breakdown, after: Breakdown) -> float:
    """How much a move lowers Σ_p T_pipe(p), as a share of it (0 unless by more than
    SLACK_GAIN): the tie-break on a plateau of T. A pipeline that is not the slowest can shed
    time there (a layer from a slow stage to a faster one), which T does not see until a
    micro-batch then moves to it: h800-h20-16-24, 68.7545 s → 68.659 s, where either move
    alone kept or raised T. Σ T_pipe falls with every such move and T never rises, so the
    polish still ends."""
    total = float(np.sum(before.pipe_time))
    gain = (total - float(np.sum(after.pipe_time))) / total
    return gain if gain > SLACK_GAIN else 0.0


class Polisher:
    def __init__(self, problem: Problem, table: StageTable, exhaustive_moves: int):
        self.problem, self.base = problem, table
        self.exhaustive = count_moves(table) <= exhaustive_moves
        self.micro_batch = problem.training.micro_batch

    def price(self, layers: np.ndarray, micro: np.ndarray) -> Breakdown:
        return breakdown(self.problem, with_split(self.base, layers, micro, self.micro_batch))

    def fits(self, b: Breakdown) -> bool:
        return bool(np.all(b.memory <= b.capacity))

    def best_of(self, moves, layers, micro, current: Breakdown, plateau: bool = True):
        """The move with the lowest full-evaluator T below `current`'s; where none lowers T (and
        `plateau`), the one that keeps T and lowers the pipelines' summed T_pipe most
        (`slack_gain`), if any."""
        best = (current.iteration * (1 - RELATIVE_GAIN), None, None)
        level, most_slack = (None, None), 0.0
        for move in moves:
            nl, nm = apply_move(layers, micro, move)
            b = self.price(nl, nm)
            if not self.fits(b):
                continue
            if b.iteration < best[0]:
                best = (b.iteration, move, b)
            elif plateau and best[1] is None and b.iteration <= current.iteration:
                gain = slack_gain(current, b)
                if gain > most_slack:
                    level, most_slack = (move, b), gain
        return (best[1], best[2]) if best[1] is not None else level

    # -- screened moves for large plans ----------------------------------------------------
    def bottleneck_moves(self, layers, micro, b: Breakdown) -> list[Move]:
        table = with_split(self.base, layers, micro, self.micro_batch)
        slow = np.flatnonzero(b.pipe_time >= b.pipe_time.max() * (1 - 1e-9))
        moves = []
        if len(slow) == 1:
            moves += self.layer_moves_in(table, int(slow[0]), b)
            moves += self.batch_moves_from(table, int(slow[0]), b)
        if b.dp_time > 0:  # layers out of the stage whose DP sync sets T_dp
            k = int(np.argmax(b.dp))
            p = int(table.pipe[k])
            moves += [Move("layer", k, j) for j in range(table.pipe_start[p], table.pipe_start[p + 1])
                      if j != k and layers[k] > 1]
        return moves

    def layer_moves_in(self, table: StageTable, p: int, b: Breakdown, keep: int = 8) -> list[Move]:
        """Layer moves inside pipeline p that lower its T_pipe (cost model), best first."""
        lo, hi = table.pipe_start[p], table.pipe_start[p + 1]
        plus = stage_times(self.problem, replace(table, layers=table.layers + 1))[2]
        minus = stage_times(self.problem, replace(table, layers=table.layers - 1))[2]
        m = int(table.micro_batches[lo])
        scored = []
        for i in range(lo, hi):
            if table.layers[i] <= 1:
                continue
            for j in range(lo, hi):
                if j == i:
                    continue
                tau = b.tau[lo:hi].copy()
                tau[i - lo], tau[j - lo] = minus[i], plus[j]
                t = cost.pipeline_time(tau, b.pp[lo:hi], m)
                if t < b.pipe_time[p]:
                    scored.append((t, i, j))
        return [Move("layer", i, j) for _, i, j in sorted(scored)[:keep]]

    def batch_moves_from(self, table: StageTable, p: int, b: Breakdown) -> list[Move]:
        """One micro-batch from pipeline p to the pipeline it would slow down least."""
        if table.batch[p] // self.micro_batch <= 1:
            return []
        starts, ends = table.pipe_start[:-1], table.pipe_start[1:]
        grown = np.array([cost.pipeline_time(b.tau[s:e], b.pp[s:e], int(table.micro_batches[s]) + 1)
                          for s, e in zip(starts, ends)])
        grown[p] = np.inf
        return [Move("batch", p, int(np.argmin(grown)))]

    def run(self, layers: np.ndarray, micro: np.ndarray, rounds: int, deadline: float):
        """Polish until no move helps, `rounds` moves are made or the deadline passes."""
        b, flat = self.price(layers, micro), 0  # flat: plateau moves since T last dropped
        for _ in range(rounds):
            if time.perf_counter() > deadline:
                break
            moves = (all_moves(self.base, layers, micro) if self.exhaustive
                     else self.bottleneck_moves(layers, micro, b))
            move, nb = self.best_of(moves, layers, micro, b, plateau=flat < PLATEAU_MOVES)
            if move is None:
                break
            flat = 0 if nb.iteration < b.iteration * (1 - RELATIVE_GAIN) else flat + 1
            layers, micro = apply_move(layers, micro, move)
            b = nb
        return layers, micro, b


def polish(problem: Problem, table: StageTable, *, rounds: int = 400, exhaustive_moves: int = 600,
           deadline: float = float("inf")):
    """(layers, micro-batches, breakdown) after local search from the table's split."""
    micro = table.batch // problem.training.micro_batch
    return Polisher(problem, table, exhaustive_moves).run(table.layers.copy(), micro, rounds, deadline)
