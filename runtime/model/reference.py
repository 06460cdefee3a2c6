"""The same model trained in one process on the whole batch: the equivalence baseline."""

from __future__ import annotations

from pathlib import Path

import torch

from runtime.config import RunConfig
from runtime.model.data import BatchLoader, run_source
from runtime.model.llama import ReferenceLlama


def train_reference(config: RunConfig, global_batch: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Per-step losses (mean over all B·s tokens) and the parameters after the last step."""
    model = ReferenceLlama(config.model, config.seq_len, config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay,
                                  foreach=False)
    loader = BatchLoader(run_source(config, global_batch), config.seq_len)
    losses = []
    for step in range(config.steps):
        optimizer.zero_grad(set_to_none=True)
        loss = model(*loader.batch(step, 0, global_batch))
        loss.backward()
        if config.clip_grad is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad)
        optimizer.step()
        losses.append(loss.item())
    return losses, model.full_state()


def load_pipeline_params(out_dir: str | Path) -> list[dict[str, torch.Tensor]]:
    """Reassemble each pipeline's full parameters from the shards the ranks dumped
    (`dump_params`): shards are concatenated along their TP dimension in TP-rank order."""
    pieces: dict[int, dict[str, dict[int, tuple[torch.Tensor, int | None]]]] = {}
    for path in sorted(Path(out_dir).glob("rank*.pt")):
        dump = torch.load(path)
        for name, (tensor, dim) in dump["params"].items():
            pieces.setdefault(dump["pipeline"], {}).setdefault(name, {})[dump["tp_rank"]] = (tensor, dim)
    pipelines = []
    for p in sorted(pieces):
        full = {}
        for name, shards in pieces[p].items():
            ordered = [shards[r] for r in sorted(shards)]
            dim = ordered[0][1]
            full[name] = ordered[0][0] if dim is None else torch.cat([t for t, _ in ordered], dim=dim)
        pipelines.append(full)
    return pipelines
