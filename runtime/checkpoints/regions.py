"""Rectangles of a flat range (no torch): a range of a tensor's row-major flattening as the
rectangles of the full tensor that tile it, so that a block of a flat vector — a sequence
plan's ZeRO-3 block, a layered plan's ZeRO-1 share — is stored as ordinary chunks with global
offsets and sizes (`runtime.checkpoints.manifest`)."""

from __future__ import annotations

from math import prod

Region = tuple[tuple[int, ...], tuple[int, ...], int, int]  # offsets, sizes, flat [lo, hi)


def flat_regions(shape: tuple[int, ...], start: int, stop: int) -> list[Region]:
    """Rectangles (global offsets, sizes) that tile elements [start, stop) of the row-major
    flattening of a 1-D or 2-D tensor, each with its flat range."""
    if len(shape) == 1:
        return [((start,), (stop - start,), start, stop)]
    cols, out, pos = prod(shape[1:]), [], start
    while pos < stop:
        row, col = divmod(pos, cols)
        if col or stop - pos < cols:  # a partial row: to the row's end, or to stop
            end = min(stop, (row + 1) * cols)
            out.append(((row, col), (1, end - pos), pos, end))
        else:  # whole rows
            end = pos + (stop - pos) // cols * cols
            out.append(((row, 0), ((end - pos) // cols, cols), pos, end))
        pos = end
    return out
