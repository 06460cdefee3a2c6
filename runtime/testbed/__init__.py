"""An emulated cluster on one host (docs/testbed.md): one network namespace per machine of a
cluster file, veth pairs to a bridge in a hub namespace, htb shaping from the file's figures
scaled by one factor, a hosts file per machine; torn down on exit, error or signal.

    from runtime.testbed import Testbed, unavailable_reason
    with Testbed(cluster) as bed:
        bed.start(0, ["torchrun", ...])

`layout` is pure (cluster → names, addresses, rates); `netns` runs `ip`/`tc`; `bed` holds
the context manager. No torch.
"""

from runtime.testbed.bed import PREFIX, Testbed, new_prefix, remove_leftovers
from runtime.testbed.layout import (HOST_MBIT, MAX_LINK_MBIT, MachineSlot, PairRate, TestbedLayout, fitting_scale,
                                    plan_layout, scaled_cluster)
from runtime.testbed.netns import TestbedError, leftovers, namespaces, unavailable_reason

__all__ = ["HOST_MBIT", "MAX_LINK_MBIT", "PREFIX", "MachineSlot", "PairRate", "Testbed", "TestbedError",
           "TestbedLayout", "fitting_scale", "leftovers", "namespaces", "new_prefix", "plan_layout",
           "remove_leftovers", "scaled_cluster", "unavailable_reason"]
