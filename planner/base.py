"""The bottom of the planner: units, the frozen base type that every typed value uses, and the
base of the input types with the name type they share."""

from __future__ import annotations

import os
import stat
import threading
from collections import Counter
from functools import lru_cache
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints, ValidationInfo, WithJsonSchema, field_validator

GB = 1e9  # bandwidth unit: GB/s = 1e9 bytes/s
GIB = 2**30  # memory unit
MAX_SEED = 2**31 - 1  # CP-SAT's random_seed is an int32 (a larger --seed was an internal error)
TFLOPS = 1e12
US = 1e-6  # latencies are written in microseconds


def plural(count, word: str) -> str:
    """'1 stage', '3 stages', '1,024 devices': a count with its noun in the right number."""
    return f"{count:,} {word}" if count == 1 else f"{count:,} {word}s"


def sizes_phrase(sizes: list[int], most: int = 16) -> str:
    """Each part's size, '4/4/2/1', or for more than `most` parts how many of each size,
    largest first, '4 ×18,000 · 2 ×559' (one line for a 10^5-device plan: the list was 37 KB)."""
    if len(sizes) <= most:
        return "/".join(map(str, sizes))
    counts = Counter(sizes)
    return " · ".join(f"{size} ×{counts[size]:,}" for size in sorted(counts, reverse=True))


def format_seconds(x: float, digits: int = 4) -> str:
    """A time in the unit that shows its digits: 22.57 s, 1.724 ms, 11.43 µs (messages and
    tables alike, so one output never mixes 1.1e-05 s with ms)."""
    unit, div = ("s", 1.0) if abs(x) >= 1 or x == 0 else ("ms", 1e-3) if abs(x) >= 1e-3 else ("µs", 1e-6)
    return f"{x / div:.{digits}g} {unit}"


def format_runs(values) -> str:
    """[0, 1, 2, 3, 8] → "0-3,8": runs of consecutive integers collapsed (device ids, D values)."""
    runs, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            runs.append(f"{start}" if start == v else f"{start}-{v}")
            start = None
    return ",".join(runs)


class Frozen(BaseModel):
    """Base of every typed value: immutable, unknown fields rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __eq__(self, other: object) -> bool:
        """Equal when of one type with equal fields. pydantic's own == compares `__dict__` first,
        which also holds `cached_property` values: two equal clusters that had computed their
        device arrays raised numpy's "truth value of an array is ambiguous" there."""
        if not isinstance(other, BaseModel):
            return NotImplemented
        return type(self) is type(other) and all(getattr(self, f) == getattr(other, f) for f in type(self).model_fields)


# Names are labels in tables, messages and plan files: one line of readable text. A name in a
# file has at most MAX_NAME characters (a 10^5-character one made `validate` take over a minute
# to print it); names derived from one may be longer (a run's tiny model is "tiny(NAME)"), so the
# limit holds where files are read: with FROM_FILE as the validation context (planner.io.build).
# A derived name that is written to a file and read back (a replanned problem's "NAME-without-"
# and the lost ids, solvers.replan.survivors_name) is cut to fit it.
MAX_NAME = 200
FROM_FILE = {"from_file": True}


def _checked_name(name: str, info: ValidationInfo) -> str:
    """No newline, tab, escape (an ANSI colour code) or other control character: a name is
    printed inside one-line messages and table cells. From a file: at most MAX_NAME long."""
    if info.context and info.context.get("from_file") and len(name) > MAX_NAME:
        raise ValueError(f"names have at most {MAX_NAME} characters")
    bad = next((c for c in name if not c.isprintable()), None)
    if bad is not None:
        raise ValueError(f"names hold printable characters only, not {bad!r}")
    return name


_NAME_SCHEMA = {"type": "string", "maxLength": MAX_NAME, "pattern": r"^[^\x00-\x1f\x7f-\x9f]*$"}
Name = Annotated[str, StringConstraints(min_length=1), AfterValidator(_checked_name),
                 WithJsonSchema({**_NAME_SCHEMA, "minLength": 1})]
# the same, where a name may be left empty (a rack's, which is only informational)
OptionalName = Annotated[str, AfterValidator(_checked_name), WithJsonSchema(_NAME_SCHEMA)]


def file_stem(name: str) -> str:
    """A name as part of a file name: names may hold '/' (a path separator) and '\\'; those,
    and '%' itself, are written as %2F, %5C and %25, so distinct names stay distinct files."""
    return name.replace("%", "%25").replace("/", "%2F").replace("\\", "%5C")


@lru_cache(maxsize=None)
def _numeric_fields(cls: type[BaseModel]) -> frozenset[str]:
    """The fields of `cls` that hold a number: int, float, a Literal of integers, or one of
    these | None (bool fields are not numbers here, though bool subclasses int)."""
    def numeric(annotation: Any) -> bool:
        if get_origin(annotation) is Literal:
            return all(type(a) is int for a in get_args(annotation))
        if get_origin(annotation) in (Union, UnionType):
            return any(numeric(a) for a in get_args(annotation) if a is not type(None))
        return annotation in (int, float)
    return frozenset(name for name, field in cls.model_fields.items() if numeric(field.annotation))


def _numeric_text(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


class Input(Frozen):
    """Base of the types read from problem, cluster and model files: besides Frozen's rules,
    numbers are finite (an inf or nan only turns into nonsense or a crash later) and written
    as numbers. pydantic would read `count: true` as 1 and `count: "2"` as 2; either is
    probably a mistake, so it is refused (as plan files refuse them, `whole_numbers`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_as_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, (bool, str)) and info.field_name in _numeric_fields(cls):
            if isinstance(value, bool):
                raise ValueError("expected a number, not true or false")
            if _numeric_text(value):  # other text is left to pydantic's own "not a valid number"
                raise ValueError("expected a number, not a quoted string: write it without quotes")
        return value


def write_atomically(path: str | Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file beside it, renamed over it: a Ctrl-C, a
    full disk or a reader at the wrong moment sees the old file or the whole new one, never a
    half-written plan or cluster (which the next command would refuse, or worse, read).

    Only a regular file (or none) is replaced: a link is followed and its target replaced (the
    link stays), and a device or a pipe (`-o /dev/stdout`, /dev/full) is written through, as
    the rename would have put a file in its place. The old file's permissions are kept, and a
    file this process may not write is written in place, so it is refused as before (a rename
    in a writable folder would replace it). Where its folder takes no new file, it is written
    in place too."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode  # of what a link points at
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):  # by its own name: /dev/stdout's target may be a pipe
        path.write_text(text)
        return path
    real = Path(os.path.realpath(path))
    if mode is not None and not os.access(real, os.W_OK):
        real.write_text(text)  # PermissionError, as an in-place write has always said
        return path
    # this process's own, and short: the output's own name may already be the 255 bytes allowed
    temporary = real.with_name(f".hexiscale-{os.getpid()}-{threading.get_ident() % 10**6}.tmp")
    try:
        with open(temporary, "w") as handle:
            if mode is not None:
                os.chmod(temporary, stat.S_IMODE(mode))
            handle.write(text)
        os.replace(temporary, real)
    except PermissionError:
        temporary.unlink(missing_ok=True)
        real.write_text(text)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path
