"""ZeRO-1's shares across asymmetric pipelines, as pure arithmetic (docs/checkpoints.md §11;
runtime/layered/zero.py): every owner of a rank set builds the same bucket, the D owners'
blocks partition it, and the shares written to a checkpoint tile every tensor exactly once,
whatever the TP sizes, D or tied embeddings; and the run's note on training bytes (§12)."""

from __future__ import annotations

from math import prod

import pytest

from planner.layered.plan import Pipeline, Plan, Stage
from planner.workload import ModelSpec, TrainingSpec
from runtime.config import RunConfig
from runtime.layered.checkpoint import saved_tensors
from runtime.layered.layout import rank_layout
from runtime.layered.zero import owned_span, rank_buckets, share_regions
from runtime.model.catalogue import model_tensors
from runtime.precision import scheme_line, training_byte_notes

GQA = ModelSpec(name="gqa", layers=4, hidden=32, heads=4, kv_heads=2, ffn_hidden=64, vocab=256)
TIED = GQA.model_copy(update={"tied_embeddings": True, "qkv_bias": True})


def plan_of(*pipelines) -> Plan:
    return Plan(pipelines=[Pipeline(batch=b, stages=[Stage(devices=d, layers=n) for d, n in stages])
                           for b, stages in pipelines])


PLANS = {
    "uneven TP": plan_of((6, [([0, 1], 3), ([2], 1)]), (2, [([3], 2), ([4, 5], 2)])),
    "D = 3, TP 4/2/1": plan_of((4, [([0, 1, 2, 3], 4)]), (2, [([4, 5], 1), ([6], 3)]), (2, [([7], 4)])),
    "one stage beside two": plan_of((4, [([0, 1], 4)]), (4, [([2], 1), ([3, 4], 3)])),
}


@pytest.mark.parametrize("spec", [GQA, TIED], ids=["untied", "tied+bias"])
@pytest.mark.parametrize("name", list(PLANS))
def test_owners_build_one_bucket_and_their_blocks_partition_it(name, spec):
    layout = rank_layout(PLANS[name])
    buckets = {rank: rank_buckets(layout, spec, rank) for rank in range(layout.world_size)}
    by_set: dict[tuple, list] = {}
    for rank, owned in buckets.items():
        for bucket in owned:
            assert rank in bucket.ranks and len(bucket.ranks) == layout.num_pipelines
            by_set.setdefault((bucket.ranks, bucket.presummed), []).append(bucket)
    for (ranks, _), copies in by_set.items():
        assert len(copies) == len(ranks)  # every owner has it
        assert len({tuple((p.name, p.sizes) for p in b.pieces) for b in copies}) == 1  # the same pieces
        spans = sorted(copies[0].owned_span(rank) for rank in ranks)
        assert spans[0][0] == 0 and spans[-1][1] == copies[0].numel
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous, no overlap
    # the tied copies travel apart from the rest: the runtime sums them before the DP sync
    assert any(key[1] for key in by_set) == spec.tied_embeddings


@pytest.mark.parametrize("spec", [GQA, TIED], ids=["untied", "tied+bias"])
@pytest.mark.parametrize("name", list(PLANS))
def test_checkpoint_shares_tile_every_tensor_once(name, spec):
    layout = rank_layout(PLANS[name])
    table = saved_tensors(layout, spec, zero_stage=1)
    shapes = model_tensors(spec)
    assert set(table) == {f"{kind}/{t}" for kind in ("param", "adam_m", "adam_v") for t in shapes}
    for key, entry in table.items():
        covered = {}
        for chunk in entry.chunks:
            for index in _cells(chunk.offsets, chunk.sizes):
                covered[index] = covered.get(index, 0) + 1
        assert len(covered) == prod(entry.shape) and set(covered.values()) == {1}, key
    # a rank's regions fill its blocks without gaps: their sizes add up to its owned elements
    for rank in range(layout.world_size):
        owned = sum(hi - lo for b in rank_buckets(layout, spec, rank) for lo, hi in [b.owned_span(rank)])
        assert sum(prod(r.sizes) for r in share_regions(layout, spec, rank)) == owned


def _cells(offsets, sizes):
    if len(sizes) == 1:
        return [(offsets[0] + i,) for i in range(sizes[0])]
    return [(offsets[0] + i, offsets[1] + j) for i in range(sizes[0]) for j in range(sizes[1])]


def test_owned_spans_split_uneven_buckets_by_ceiling():
    assert [owned_span(10, 3, i) for i in range(3)] == [(0, 4), (4, 8), (8, 10)]
    assert [owned_span(2, 3, i) for i in range(3)] == [(0, 1), (1, 2), (2, 2)]


def test_the_run_names_its_scheme_and_the_bytes_the_problem_priced_otherwise():
    config = RunConfig(model=GQA, seq_len=16, micro_batch=2, precision="bf16", zero_stage=1, sequence_parallel=True)
    line = scheme_line(config, pipelines=2)
    assert "bf16 weights" in line and "μ = 2 + 2 + 12" in line and "12/2" in line and "sequence parallelism" in line
    assert training_byte_notes(TrainingSpec(seq_len=16, global_batch=8), "bf16") == []  # §1's defaults
    (note,) = training_byte_notes(TrainingSpec(seq_len=16, global_batch=8), "fp32")
    assert "prices μ_w = 2, μ_o = 12, γ = 2, β = 2 bytes" in note
    assert "this fp32 run holds μ_w = 4, μ_o = 8, γ = 4, β = 4" in note
    fp32 = TrainingSpec(seq_len=16, global_batch=8, weight_bytes=4, optimizer_bytes=8, grad_bytes=4, act_bytes=4)
    assert training_byte_notes(fp32, "fp32") == []


def test_run_refuses_an_unknown_precision_and_bf16_on_a_sequence_plan_in_one_line():
    from typer.testing import CliRunner

    from hexiscale.cli import app
    for args, message in ((["demo-tiny", "demo-tiny", "--precision", "fp16"],
                           "--precision: expected one of fp32, bf16"),
                          (["longctx-tiny", "longctx-tiny", "--precision", "bf16"],
                           "precision bf16: sequence plans run fp32")):
        result = CliRunner().invoke(app, ["run", *args])
        assert result.exit_code == 2 and message in result.output, result.output
        assert "Traceback" not in result.output
