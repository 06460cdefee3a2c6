"""Outputs that would overwrite the command's own inputs, or each other: refused before any long
work, one line naming the option and the path (docs/cli.md, Conventions).

A write replaces its file whole (a temporary file renamed over it), so `solve p.yaml -o p.yaml`
left the plan where the problem was, and the run still ended with exit 0. Paths are compared as
files, not as spellings: `./p.yaml`, `dir/../p.yaml`, a link to it and a hard link all name the
same file (os.path.samefile where both exist)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from hexiscale.cli.app import fail

# the files a command reads or writes: what each one is ("the problem file read") → its path (None:
# not given); pairs where several are alike (compare's problem files, "a problem file read")
Files = dict[str, "Path | None"] | Iterable[tuple[str, "Path | None"]]


def file_read(source: str | Path | None) -> Path | None:
    """The file a problem, plan or model argument reads when it names a file; None for a bundled
    name (the loaders' lookup: a path that exists wins over a bundled instance of that name)."""
    if source is None or not Path(source).is_file():
        return None
    return Path(source)


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same inode where both exist (links included), the
    same absolute path otherwise (two outputs neither of which is written yet)."""
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
    except OSError:  # unreadable on the way: compare the spellings, as for files not there yet
        pass
    return Path(a).resolve() == Path(b).resolve()


def same_as(path: Path | None, others: Files) -> str | None:
    """What `path` is among `others`, or None."""
    if path is None:
        return None
    for what, other in others.items() if isinstance(others, dict) else others:
        if other is not None and same_file(path, other):
            return what
    return None


def refuse_same_file(output: Path | None, option: str, inputs: Files) -> None:
    """Fail where `output` is one of `inputs` (the files read, and the outputs written before
    it): the write would replace it."""
    what = same_as(output, inputs)
    if what is not None:
        fail(f"{option}: {output} is {what} too: one would overwrite the other; name another file")


def nested(inner: Path, outer: Path) -> bool:
    """Whether folder `inner` is `outer` or lies inside it (links resolved)."""
    inner, outer = Path(inner).resolve(), Path(outer).resolve()
    return inner == outer or outer in inner.parents


def refuse_nested_folder(output: Path, option: str, folder: Path, what: str) -> None:
    """Fail where the output folder is `folder` (`what` it is, "the checkpoint folder read"),
    lies inside it, or holds it: the files written would land among the ones read, or the folder
    written would hold them (copied, uploaded or removed with it)."""
    if nested(output, folder) and nested(folder, output):
        fail(f"{option}: {output} is {what}: write to a folder outside it")
    if nested(output, folder):
        fail(f"{option}: {output} is inside {what}, {folder}: write to a folder outside it")
    if nested(folder, output):
        fail(f"{option}: {output} holds {what}, {folder}: write to a folder outside it")
