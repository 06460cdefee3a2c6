"""The runtime of every plan kind, by the planner's kind name; `runtime_kind` looks one up."""

from __future__ import annotations

from typing import Any

from planner.kinds import kind_of
from runtime import layered, sequence
from runtime.errors import UnknownKindError
from runtime.runtime_kind import RuntimeKind

RUNTIME_KINDS: dict[str, RuntimeKind] = {k.name: k for k in (layered.KIND, sequence.KIND)}


def runtime_kind(name: str) -> RuntimeKind:
    if name not in RUNTIME_KINDS:
        raise UnknownKindError(f"no runtime for plan kind {name!r}; the runtime runs: "
                               f"{', '.join(RUNTIME_KINDS)}")
    return RUNTIME_KINDS[name]


def runtime_of(plan: Any) -> RuntimeKind:
    """The runtime of a plan object, by its planner kind."""
    try:
        name = kind_of(plan).name
    except TypeError as exc:
        raise UnknownKindError(str(exc)) from None
    return runtime_kind(name)
