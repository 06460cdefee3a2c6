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
    # bf16 (§12): the optimizer updates fp32 masters; the model computes with bf16 copies of them
    masters = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()] if config.precision == "bf16" \
        else list(model.parameters())
    optimizer = torch.optim.AdamW(masters, lr=config.lr, weight_decay=config.weight_decay, foreach=False)
    model.to(torch.bfloat16 if config.precision == "bf16" else torch.float32)
    loader = BatchLoader(run_source(config, global_batch), config.seq_len)
    losses = []
    for step in range(config.steps):
        optimizer.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        loss = model(*loader.batch(step, 0, global_batch))
        loss.backward()
        for master, param in zip(masters, model.parameters()):
            master.grad = param.grad.float() if master is not param else master.grad
        if config.clip_grad is not None:
            torch.nn.utils.clip_grad_norm_(masters, config.clip_grad)
        optimizer.step()
        with torch.no_grad():
            for master, param in zip(masters, model.parameters()):
                param.copy_(master)  # a no-op in fp32 (the same tensor)
        losses.append(loss.item())
    return losses, {name: t.float() for name, t in model.full_state().items()}


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
