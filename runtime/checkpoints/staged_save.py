"""A Hugging Face folder written so that an interrupted save never passes for a whole one
(no torch here: the CLI reads it after a Ctrl-C).

Every new file is first written into OUT/.hexiscale-save-PID (a save that is stopped there
leaves OUT as it was, plus that folder, which the next save or the interrupted command
removes). Publishing then removes OUT's config.json and the weight files this save does not
write, moves the new files in, and moves config.json in last: stopped in between, OUT has no
config.json, and transformers refuses to load it instead of loading old weights under a new
config (as writing config.json first allowed).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

STAGING_PREFIX = ".hexiscale-save-"  # a save's new files before they are published
PARAMS_FOLDER = ".hexiscale-params"  # run --save-hf's weight chunks before their conversion
CONFIG = "config.json"


def staging_folder(out: Path) -> Path:
    """A fresh folder for one save's files inside `out` (made)."""
    staging = out / f"{STAGING_PREFIX}{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def publish(staging: Path, out: Path, stale: list[Path]) -> None:
    """Move every staged file into `out`, config.json last, after removing `out`'s config.json
    and the `stale` files (an earlier save's weights that these do not replace)."""
    for path in [out / CONFIG, *stale]:
        path.unlink(missing_ok=True)
    staged = sorted(staging.iterdir(), key=lambda p: p.name == CONFIG)  # config.json last
    for path in staged:
        os.replace(path, out / path.name)
    staging.rmdir()


def partial_saves(out: str | Path, params: bool = True) -> list[Path]:
    """What an interrupted save left in `out`: staging folders (and, with `params`, the weight
    chunks run --save-hf had not converted yet)."""
    out = Path(out)
    if not out.is_dir():
        return []
    return sorted(p for p in out.iterdir() if p.is_dir() and (
        p.name.startswith(STAGING_PREFIX) or (params and p.name == PARAMS_FOLDER)))


def remove_partial_saves(out: str | Path, log: Callable[[str], None] | None = None, params: bool = True) -> list[str]:
    """Remove what `partial_saves` finds, said through `log`; returns the names removed."""
    removed = partial_saves(out, params)
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    if removed and log is not None:
        log(f"removed from {out} what an interrupted save left: " + ", ".join(p.name for p in removed))
    return [p.name for p in removed]


def cut_short(out: str | Path) -> str:
    """After an interrupted run or export: its partial files removed, and what `out` holds now."""
    removed = remove_partial_saves(out)
    out = Path(out)
    if not removed and not out.is_dir():
        return ""
    if out.is_dir() and not (out / CONFIG).is_file() and any(p.suffix == ".safetensors" for p in out.iterdir()):
        return f"the save to {out} was cut short while it was published: {out} has no config.json (incomplete)"
    if removed:
        return f"the save to {out} was cut short: its partial files were removed and {out} is as it was"
    return ""
