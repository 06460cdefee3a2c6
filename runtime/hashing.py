"""The sha256 of a file, read in 1 MiB blocks: checkpoint shards are verified by it and token
caches are keyed by it (runtime.checkpoints.manifest, runtime.model.text)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
