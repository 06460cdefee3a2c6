"""Public on-demand prices of the catalog's GPU types (instances/prices.yaml, sources and dates in
its comments), and a cluster priced from them (`hexiscale generate cluster --prices`,
docs/prices.md §13)."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml

from planner.hardware import Cluster, builtin_catalog


@lru_cache(maxsize=1)
def builtin_prices() -> dict[str, float]:
    """USD per device-hour of each catalog type."""
    entries = yaml.safe_load(resources.files("instances").joinpath("prices.yaml").read_text())["prices"]
    return {e["gpu"]: float(e["price_per_hour"]) for e in entries}


def priced(cluster: Cluster, prices: dict[str, float] | None = None) -> Cluster:
    """The cluster with `price_per_hour` on every GPU type its machines use that has none yet
    (a catalog type is written into `gpu_types` with its price; figures a machine or type
    already carries are kept). Raises ValueError naming a type the table does not price."""
    prices = builtin_prices() if prices is None else prices
    used = sorted({m.gpu for m in cluster.machines})
    own = {t.name: t for t in cluster.gpu_types}
    types = list(cluster.gpu_types)
    for name in used:
        gpu = own.get(name) or builtin_catalog()[name]
        if gpu.price_per_hour is not None:
            continue
        if name not in prices:
            raise ValueError(f"no price for GPU type {name!r} in instances/prices.yaml; "
                             f"priced: {', '.join(sorted(prices))}")
        priced_type = gpu.model_copy(update={"price_per_hour": prices[name]})
        types = [priced_type if t.name == name else t for t in types] if name in own else types + [priced_type]
    return Cluster.model_validate({**cluster.model_dump(exclude_defaults=True),
                                   "gpu_types": [t.model_dump(exclude_defaults=True) for t in types]})
