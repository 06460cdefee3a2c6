"""Talking to other ranks (docs/solvers.md §6, docs/vendors.md §8): `communicator` (the one owner of
torch.distributed: world, process groups, every send, receive and collective, vendor routing
over the bridge), `comm_types` (its values: rank places, groups, pending sends, the waiter,
the bridge's byte meter), `packing` (flat buffers a gradient sync packs into, kept between
steps). Modules are imported by their full name; this package imports nothing.
"""
