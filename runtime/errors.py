"""The errors a run reports to its caller (no torch)."""


class RunError(RuntimeError):
    """The run cannot start or failed; the message says why (each failed rank and its reason)."""


class UnknownKindError(RunError):
    """No runtime is registered for a plan kind."""


class ConfigError(ValueError):
    """The job cannot run as configured (world size, TP vs heads, ...): every rank says so."""
