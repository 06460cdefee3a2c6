"""`--clip-grad`: the gradients' global norm over the whole model, clipped as torch's
clip_grad_norm_ does in one process (docs/models-and-data.md §12), under any plan.

- Without processes: every rank's counted gradient elements (runtime.layered.clipping,
  runtime.sequence.clipping) add up to the whole model's, each element once — TP shards,
  norms replicated in a TP group, pipelines with other layer splits, a tied head's copies,
  ZeRO-3 blocks of replicas of different sizes — and the coefficient is torch's.
- With processes (slow): a tied qwen2 with q/k/v biases under a TP 2/1 pipeline, two
  pipelines (3+1 | 1+3) and a sequence plan, clipped to 0.5 (its norms are 1.2-1.5, so every
  step clips): each step's norm before clipping equals clip_grad_norm_'s in a one-process
  transformers loop to 1e-5, and so do the losses and the saved parameters.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from hexiscale.cli import app
from planner.layered.plan import Pipeline, Plan, Stage
from planner.workload import ModelSpec
from runtime.clipping import clip_coefficient, clip_global_norm
from runtime.communication.comm_types import Group
from runtime.layered.clipping import counted_grads
from runtime.layered.groups import RankGroups
from runtime.layered.layout import rank_layout
from runtime.layered.stage import StageModel
from runtime.model.data import CORPUS_PATH
from runtime.model.llama import ReferenceLlama
from runtime.model.text import CACHE_ENV
from runtime.sequence.shards import unit_catalogues
from runtime.sequence.zero import ZeroStates
from hf_models import folder_problem, relative_distance, stream_of, train_transformers, write_jsonl

TIED = ModelSpec(name="tied", layers=4, hidden=32, heads=4, kv_heads=2, ffn_hidden=64, vocab=256,
                 tied_embeddings=True, qkv_bias=True)
STEPS, B, S, LR, WD, CLIP = 4, 4, 16, 1e-3, 0.01, 0.5


class OneProcess:
    """A communicator of a world of one: what clip_global_norm needs of it."""

    device, world = torch.device("cpu"), None

    def all_reduce(self, tensor, group, op="sum"):
        return tensor


def model_squares(spec: ModelSpec) -> float:
    """Σ w² over the one-process model's parameters (a tied matrix once)."""
    return sum(float(p.detach().double().pow(2).sum()) for p in ReferenceLlama(spec, 8, 0).parameters())


def test_layered_ranks_count_every_element_once():
    """Gradients set to the weights themselves: the counted squares of all ranks of a plan
    with TP 2 and 1 stages, uneven layer splits and three pipelines are the whole model's."""
    plan = Plan(pipelines=[Pipeline(batch=4, stages=[Stage(devices=[0, 1], layers=3), Stage(devices=[2], layers=1)]),
                           Pipeline(batch=2, stages=[Stage(devices=[3, 4], layers=4)]),
                           Pipeline(batch=2, stages=[Stage(devices=[5], layers=1), Stage(devices=[6, 7], layers=3)])])
    layout, total, pipeline_zero = rank_layout(plan), 0.0, 0.0
    for rank in range(layout.world_size):
        stage = layout.stage_of(rank)
        groups = RankGroups(rank=rank, layout=layout, stage=stage)
        model = StageModel(TIED, stage, groups.tp_rank, None, 8, seed=0)
        for param in model.parameters():
            param.grad = param.detach().clone()
        total += sum(float(g.double().pow(2).sum()) for g in counted_grads(model, groups))
        if stage.pipeline == 0:  # what pipeline 0 holds, replicated norms and the tied copy included
            pipeline_zero += sum(float(p.detach().double().pow(2).sum()) for p in model.parameters())
    assert total == pytest.approx(model_squares(TIED), rel=1e-12)
    assert pipeline_zero > total * 1.05  # the replicas and the copy are really left out


def test_sequence_replica_zero_counts_every_element_once():
    """Blocks of a replica of 3 members (padded) and of 1: replica 0's blocks are the model."""
    catalogues, total = unit_catalogues(TIED), 0.0
    for index in range(3):
        group = Group(ranks=(0, 1, 2), vendors=(), handle=None)
        states = ZeroStates(catalogues, seed=0, comm=None, group=group, index=index)
        total += sum(float(b.detach().double().pow(2).sum()) for b in states.blocks)
    assert total == pytest.approx(model_squares(TIED), rel=1e-12)


def test_coefficient_and_scaling_are_torch_clip_grad_norm():
    torch.manual_seed(0)
    grads = [torch.randn(5, 7), torch.randn(3)]
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for param, grad in zip(params, grads):
        param.grad = grad.clone()
    expected = float(torch.nn.utils.clip_grad_norm_(params, 1.5))
    held = [g.clone() for g in grads]
    norm = clip_global_norm(OneProcess(), held, held, 1.5)
    assert norm == pytest.approx(expected, rel=1e-6)
    assert all(torch.allclose(h, p.grad, rtol=1e-6, atol=0) for h, p in zip(held, params))
    assert clip_coefficient(10.0, norm) == 1.0  # under the threshold: left alone
    untouched = [g.clone() for g in grads]
    clip_global_norm(OneProcess(), untouched, untouched, 10.0)
    assert all(torch.equal(u, g) for u, g in zip(untouched, grads))


PLANS = {
    "tp": {"format": "hexiscale.plan/1", "pipelines": [
        {"batch": 4, "stages": [{"devices": [0, 1], "layers": 3}, {"devices": [2], "layers": 1}]}]},
    "pp": {"format": "hexiscale.plan/1", "pipelines": [
        {"batch": 2, "stages": [{"devices": [0], "layers": 3}, {"devices": [1], "layers": 1}]},
        {"batch": 2, "stages": [{"devices": [2], "layers": 1}, {"devices": [3], "layers": 3}]}]},
    "seq": {"format": "hexiscale.seqplan/1", "replicas": [
        {"batch": 2, "ring": [{"members": [{"device": 0, "heads": 2, "tokens": 8},
                                           {"device": 1, "heads": 2, "tokens": 8}]}]},
        {"batch": 2, "ring": [{"members": [{"device": 2, "heads": 4, "tokens": 16}]}]}]},
}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A tied qwen2 with biases, its problem and the plans; the clipped transformers loop."""
    root = tmp_path_factory.mktemp("clip")
    patch = pytest.MonkeyPatch()
    patch.setenv(CACHE_ENV, str(root / "cache"))
    folder_problem(root, "qwen", "qwen2", tied=True, seq_len=S, global_batch=B, token_block=4)
    write_jsonl(root / "text.jsonl", CORPUS_PATH.read_text())
    for name, plan in PLANS.items():
        (root / f"{name}.json").write_text(json.dumps({**plan, "problem": "qwen"}))
    norms: list[float] = []
    losses, model = train_transformers(root / "qwen", stream_of(root / "text.jsonl", root / "qwen"), steps=STEPS,
                                       global_batch=B, seq_len=S, lr=LR, weight_decay=WD, clip_grad=CLIP,
                                       grad_norms=norms)
    assert min(norms) > 2 * CLIP  # every step clips
    yield root, (losses, norms, dict(model.state_dict()))
    patch.undo()


@pytest.mark.slow
@pytest.mark.parametrize("plan", ["tp", "pp", "seq"])
def test_clipped_run_equals_clip_grad_norm(work, plan):
    root, (ref_losses, ref_norms, ref_state) = work
    out, saved = root / f"run-{plan}", root / f"saved-{plan}"
    result = CliRunner().invoke(app, ["run", *map(str, (
        root / "qwen.yaml", root / f"{plan}.json", "--init-from", root / "qwen", "--data", root / "text.jsonl",
        "--steps", STEPS, "--lr", LR, "--weight-decay", WD, "--clip-grad", CLIP, "--save-hf", saved,
        "--out", out))])
    assert result.exit_code == 0, result.output
    steps = json.loads((out / "metrics.json").read_text())["steps"]
    norms, losses = [s["grad_norm"] for s in steps], [s["loss"] for s in steps]
    assert all(abs(a - b) <= 1e-5 * b for a, b in zip(norms, ref_norms)), (norms, ref_norms)
    assert all(abs(a - b) <= 1e-5 * b for a, b in zip(losses, ref_losses)), (losses, ref_losses)
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).state_dict()
    assert relative_distance(dict(trained), ref_state) <= 1e-5
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
