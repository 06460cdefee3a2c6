"""Ring attention's block work per rank (runtime.sequence.blocks): each block attended on what
the causal mask lets through — the own block as plain causal attention, every other block of
the mirrored layout as one dense rectangle — against the whole block under the position mask
(what ring attention did before, and what a ring that ignores the layout does).

For a ring of G equal groups of single members over s tokens (8 heads of 64, one sequence,
fp32, the CPU flash kernel, one thread), every group's forward + backward over all G blocks,
kernels alone (no ring traffic). The slowest group paces the ring; "pairs" is the (query, key)
pairs the kernels compute against the causal pairs s(s+1)/2 the cost model prices (§7.2).

    .venv/bin/python benchmarks/bench_ring_blocks.py [--lengths 2048,4096] [--groups 2,4]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import typer
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_timing import call_seconds  # noqa: E402
from planner.sequence.plan import SeqPlan  # noqa: E402
from runtime.sequence.blocks import BlockShape, attend, attend_backward, causal_bias  # noqa: E402
from runtime.sequence.layout import seq_rank_layout  # noqa: E402

HEADS, HEAD_DIM = 8, 64
console = Console()


def whole_block(query_pos: torch.Tensor, key_pos: torch.Tensor) -> BlockShape:
    """The whole block under the position mask."""
    rows, cols = slice(0, len(query_pos)), slice(0, len(key_pos))
    return BlockShape("masked", rows, cols, causal_bias(query_pos, key_pos, torch.float32))


def pairs(shape: BlockShape) -> int:
    rows, cols = shape.rows.stop - shape.rows.start, shape.cols.stop - shape.cols.start
    return rows * (rows + 1) // 2 if shape.mode == "causal" else rows * cols


def block_seconds(shape: BlockShape, q, k, v, repeats: int) -> float:
    """Forward + backward of one block on `shape`, best of `repeats` (after one warm-up)."""
    grad = torch.randn_like(q)

    def once():
        out, lse = attend("flash_cpu", shape, q, k, v)
        merged_out, merged_lse = torch.zeros_like(q), torch.zeros(q.shape[:3])
        merged_out[:, :, shape.rows], merged_lse[:, :, shape.rows] = out, lse
        attend_backward("flash_cpu", shape, grad, q, k, v, merged_out, merged_lse)

    return min(call_seconds(once, repeats))


def ring_row(seq_len: int, groups: int, repeats: int) -> dict:
    plan = SeqPlan.from_rings(problem="bench", batches=[1],
                              rings=[[[(g, HEADS, seq_len // groups)] for g in range(groups)]])
    ring = seq_rank_layout(plan, kv_heads=HEADS).replicas[0].groups
    per_group = {"whole": [], "causal-aware": []}
    computed = {"whole": 0, "causal-aware": 0}
    for g, group in enumerate(ring):
        query = torch.as_tensor(group.positions())
        q = torch.randn(1, HEADS, len(query), HEAD_DIM)
        spent = {"whole": 0.0, "causal-aware": 0.0}
        for step in range(groups):
            key = torch.as_tensor(ring[(g - step) % groups].positions())
            k, v = torch.randn(2, 1, HEADS, len(key), HEAD_DIM)
            for name, shape in (("whole", whole_block(query, key)), ("causal-aware", BlockShape.of(query, key, torch.float32))):
                spent[name] += block_seconds(shape, q, k, v, repeats)
                computed[name] += pairs(shape)
        for name in spent:
            per_group[name].append(spent[name])
    causal = seq_len * (seq_len + 1) // 2
    return {"s": seq_len, "G": groups, "whole_s": max(per_group["whole"]),
            "aware_s": max(per_group["causal-aware"]), "whole_pairs": computed["whole"] / causal,
            "aware_pairs": computed["causal-aware"] / causal}


def main(lengths: str = "2048,4096", groups: str = "2,4", repeats: int = 2) -> None:
    torch.set_num_threads(1)
    table = Table(title="ring attention, block work of the slowest rank (forward + backward)")
    for column in ("s", "G", "whole blocks ms", "causal-aware ms", "speed-up", "pairs: whole", "pairs: aware"):
        table.add_column(column, justify="right")
    for seq_len in (int(x) for x in lengths.split(",")):
        for count in (int(x) for x in groups.split(",")):
            row = ring_row(seq_len, count, repeats)
            table.add_row(str(row["s"]), str(row["G"]), f"{row['whole_s'] * 1e3:.0f}", f"{row['aware_s'] * 1e3:.0f}",
                          f"{row['whole_s'] / row['aware_s']:.2f}×", f"{row['whole_pairs']:.2f}×",
                          f"{row['aware_pairs']:.2f}×")
    console.print(table)


if __name__ == "__main__":
    typer.run(main)
