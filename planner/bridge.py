"""Traffic across the cross-vendor bridge (docs/vendors.md §8), shared by both plan kinds.

The runtime routes every collective by the vendors of its ranks: inside one vendor it never
touches the bridge; over ranks of V vendors (nvidia and amd among them) it works inside each
vendor first and only the V vendor leaders talk over the bridge. What one collective sends
over the bridge, all ranks together, of a payload of x bytes:
- point-to-point between an nvidia and an amd rank: x;
- all-reduce: every leader sends its vendor's partial sum to every other leader, V·(V−1)·x;
- all-gather and reduce-scatter of a tensor of x bytes in all: every leader sends its
  vendor's blocks (all-gather) or the other vendors' blocks of its partial sum
  (reduce-scatter) to the other leaders, (V−1)·x.
`BridgeTraffic` is what a plan sends over the bridge per iteration, and how much of its
iteration time T sits in terms whose devices span both vendors ("bridge-bound").
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from planner.base import Frozen
from planner.pairs import NOT_BRIDGED

OTHER_CODE = 2  # vendor code of `other` in `vendor_codes` (0 nvidia, 1 amd as bridge sides)


class BridgeTraffic(Frozen):
    """A plan's traffic over the bridge per iteration (both plan kinds)."""

    bytes_per_step: float = Field(ge=0, description="bytes sent over the bridge per iteration, all ranks together")
    bytes_by_kind: dict[str, float] = Field(description="the same bytes by traffic kind (pp, dp, ring, zero)")
    bridge_s: float = Field(ge=0, description="seconds of T in terms whose devices span nvidia and amd")
    iteration_s: float = Field(gt=0, description="T of the plan")

    @property
    def share(self) -> float:
        """The bridge-bound fraction of T."""
        return self.bridge_s / self.iteration_s


def vendor_codes(cluster) -> np.ndarray:
    """Per machine: 0 nvidia, 1 amd, OTHER_CODE other."""
    side = cluster.machine_bridge_side
    return np.where(side == NOT_BRIDGED, OTHER_CODE, side)


def vendor_spread(cluster, machines: np.ndarray) -> np.ndarray:
    """V per row of `machines` (rows × k machine indices): the number of distinct vendors of
    the row when it holds both nvidia and amd machines, else 0 (the row never crosses)."""
    code = vendor_codes(cluster)[np.asarray(machines)]
    present = np.stack([(code == c).any(axis=-1) for c in (0, 1, OTHER_CODE)])
    return np.where(present[0] & present[1], present.sum(axis=0), 0)


def crosses(cluster, mi, mj) -> np.ndarray:
    """Whether machine pairs (mi, mj) are on the two sides of the bridge (element-wise)."""
    side = cluster.machine_bridge_side
    si, sj = side[np.asarray(mi)], side[np.asarray(mj)]
    return (si != sj) & (si != NOT_BRIDGED) & (sj != NOT_BRIDGED)


def allreduce_bridge_bytes(spread, nbytes):
    """Bytes over the bridge of an all-reduce of `nbytes` over ranks of `spread` vendors."""
    return spread * np.maximum(spread - 1, 0) * nbytes


def gather_bridge_bytes(spread, nbytes):
    """Bytes over the bridge of an all-gather (or reduce-scatter) of `nbytes` in all."""
    return np.maximum(spread - 1, 0) * nbytes
