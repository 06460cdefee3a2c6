"""Golden tests of the runtime's pure parts: rank layout, the schedules it runs (from the
planner's registry), tiny model, data slices, the plan-kind registry, the job's defaults.
No processes are started here."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.layered.plan import Pipeline, Plan, Stage
from planner.schedules import SCHEDULES, Action, Pass, get_schedule, max_in_flight
from planner.workload import ModelSpec
from runtime.config import check_model_fits
from runtime.model.data import CORPUS_PATH, BatchLoader, ByteCorpusSource, SyntheticSource
from runtime.layered.job import tiny_model
from runtime.layered.layout import LayoutError, rank_layout
from runtime.model.llama import unit_params

F, B = Pass.forward, Pass.backward


def plan_of(*pipelines: tuple[int, list[tuple[list[int], int]]]) -> Plan:
    return Plan(pipelines=[Pipeline(batch=b, stages=[Stage(devices=d, layers=n) for d, n in stages])
                           for b, stages in pipelines])


# Two pipelines over 4 layers: P0 = [TP4 on devices 8..11: 3 layers, TP1 on 5: 1 layer],
# P1 = [TP2 on 0,1: 2 layers, TP1 on 2: 2 layers]. Ranks in plan order: 8..11 → 0..3,
# 5 → 4, 0,1 → 5,6, 2 → 7.
ASYM = plan_of((6, [([8, 9, 10, 11], 3), ([5], 1)]), (2, [([0, 1], 2), ([2], 2)]))


def test_ranks_follow_plan_order_and_map_back_to_devices():
    layout = rank_layout(ASYM)
    assert layout.world_size == 8
    assert [s.ranks for s in layout.stages] == [(0, 1, 2, 3), (4,), (5, 6), (7,)]
    assert [layout.device_of(r) for r in range(8)] == [8, 9, 10, 11, 5, 0, 1, 2]
    assert [(s.layer_start, s.layer_end, s.first, s.last) for s in layout.stages] == [
        (0, 3, True, False), (3, 4, False, True), (0, 2, True, False), (2, 4, False, True)]
    assert layout.tp_group_keys() == [(0, 1, 2, 3), (5, 6)]
    assert [(p.src, p.dst) for p in layout.p2p] == [(0, 4), (5, 7)]
    with pytest.raises(LayoutError, match="outside the plan's world of 8"):
        layout.stage_of(8)


def test_chunk_groups_cut_at_the_finest_shard():
    """Worked by hand: units 0 (emb), 1..4 (layers 0..3), 5 (head)."""
    groups = {(g.unit, g.chunk): (g.num_chunks, g.ranks) for g in rank_layout(ASYM).chunk_groups}
    # emb and layers 0, 1: TP4 (ranks 0..3) vs TP2 (5, 6): 4 chunks; TP2 rank j owns chunks 2j, 2j+1
    for unit in (0, 1, 2):
        assert [groups[(unit, c)] for c in range(4)] == [(4, (0, 5)), (4, (1, 5)), (4, (2, 6)), (4, (3, 6))]
    # layer 2: TP4 vs TP1 (rank 7 owns all four chunks)
    assert [groups[(3, c)] for c in range(4)] == [(4, (r, 7)) for r in range(4)]
    # layer 3 and head: TP1 (rank 4) vs TP1 (rank 7): one chunk
    assert groups[(4, 0)] == groups[(5, 0)] == (1, (4, 7))
    assert len(groups) == 3 * 4 + 4 + 2
    assert rank_layout(ASYM).dp_group_keys() == [(0, 5), (0, 7), (1, 5), (1, 7), (2, 6), (2, 7),
                                                 (3, 6), (3, 7), (4, 7)]


def test_single_pipeline_needs_no_dp_groups():
    layout = rank_layout(plan_of((8, [([0, 1], 3), ([2], 1)])))
    assert layout.dp_group_keys() == []
    assert all(len(g.ranks) == 1 for g in layout.chunk_groups)


def test_plan_errors_name_the_numbers():
    with pytest.raises(LayoutError, match=r"different layer counts \[4, 3\]"):
        rank_layout(plan_of((4, [([0], 4)]), (4, [([1], 3)])))
    with pytest.raises(LayoutError, match="TP size 3 is not a power of two"):
        rank_layout(plan_of((4, [([0, 1, 2], 4)])))
    with pytest.raises(LayoutError, match=r"devices \[1\] are used by more than one stage"):
        rank_layout(plan_of((4, [([0, 1], 4)]), (4, [([1], 4)])))


@pytest.mark.parametrize("m,stages", [(1, 1), (3, 2), (4, 4), (2, 5), (8, 3)])
def test_one_f_one_b_order(m: int, stages: int):
    for k in range(stages):
        actions = get_schedule("1f1b").actions(stages, k, m)
        order = [(a.pass_, a.micro_batch) for a in actions]
        assert sorted(order) == sorted([(F, i) for i in range(m)] + [(B, i) for i in range(m)])
        assert all(order.index((F, i)) < order.index((B, i)) for i in range(m))
        # in flight (forwarded, not yet backwarded) never exceeds min(S - k, m): docs/cost-model.md §3.5 q
        live, peak = 0, 0
        for kind, _ in order:
            live += 1 if kind is F else -1
            peak = max(peak, live)
        assert peak == min(stages - k, m) == max_in_flight(actions)


def _orders(name: str, num_stages: int, m: int) -> list[str]:
    return [" ".join(f"{a.pass_.value[0].upper()}{a.micro_batch}" for a in get_schedule(name).actions(num_stages, k, m))
            for k in range(num_stages)]


def test_golden_orders_for_three_stages_and_four_micro_batches():
    assert _orders("1f1b", 3, 4) == ["F0 F1 F2 B0 F3 B1 B2 B3",
                                     "F0 F1 B0 F2 B1 F3 B2 B3",
                                     "F0 B0 F1 B1 F2 B2 F3 B3"]
    assert _orders("gpipe", 3, 4) == ["F0 F1 F2 F3 B0 B1 B2 B3"] * 3
    assert get_schedule("1f1b").actions(3, 0, 4)[0] == Action(Pass.forward, 0)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_each_schedule_holds_what_its_memory_is_priced_for(name: str):
    """max_in_flight(actions) = in_flight(S, k, m): the runtime holds what the cost model prices."""
    schedule = get_schedule(name)
    for num_stages in range(1, 9):
        for m in range(1, 13):
            for k in range(num_stages):
                actions = schedule.actions(num_stages, k, m)
                order = [(a.pass_, a.micro_batch) for a in actions]
                assert sorted(order) == sorted([(F, i) for i in range(m)] + [(B, i) for i in range(m)])
                assert all(order.index((F, i)) < order.index((B, i)) for i in range(m))
                assert max_in_flight(actions) == int(schedule.in_flight(num_stages, k, m)), (name, num_stages, k, m)


def test_an_unknown_schedule_names_the_known_ones():
    with pytest.raises(KeyError, match="unknown schedule 'zb'; available: 1f1b, gpipe"):
        get_schedule("zb")


def test_tiny_model_keeps_layers_and_splits_for_every_tp():
    llama = ModelSpec(name="llama2-7b", layers=32, hidden=4096, heads=32, ffn_hidden=11008, vocab=32000)
    plan = plan_of((8, [([0, 1, 2, 3, 4, 5, 6, 7], 30), ([8, 9], 2)]))
    tiny = tiny_model(llama, plan)
    assert tiny.layers == 32 and tiny.num_kv_heads == tiny.heads == 8  # MHA kept (ratio 1)
    check_model_fits(tiny, [8, 2, 1])
    gqa = ModelSpec(name="g", layers=4, hidden=64, heads=8, kv_heads=2, ffn_hidden=172, vocab=256)
    tiny = tiny_model(gqa, plan_of((8, [([0], 4)])))
    assert (tiny.heads, tiny.num_kv_heads, tiny.hidden) == (4, 2, 32)  # ratio capped at 2, h ≥ 32
    with pytest.raises(ValueError, match=r"TP size 4 does not divide the model's kv heads \(2\)"):
        check_model_fits(gqa, [1, 4])


def test_unit_params_add_up_to_the_design_parameter_counts():
    spec = ModelSpec(name="g", layers=3, hidden=64, heads=8, kv_heads=2, ffn_hidden=172, vocab=256)
    count = lambda unit: sum(torch.Size(s).numel() for s, _ in unit_params(spec, unit).values())  # noqa: E731
    assert count(0) == spec.params_embedding
    assert count(1) == count(3) == spec.params_per_layer
    assert count(4) == spec.params_head


def test_loader_slices_agree_with_the_whole_batch():
    for source in (SyntheticSource(256, seed=3), ByteCorpusSource(256, seed=3)):
        loader = BatchLoader(source, seq_len=16)
        inputs, labels = loader.batch(step=2, start=0, count=6)
        part_inputs, part_labels = loader.batch(step=2, start=4, count=2)
        assert torch.equal(inputs[4:], part_inputs) and torch.equal(labels[4:], part_labels)
        assert torch.equal(inputs[:, 1:], labels[:, :-1])  # labels are the next tokens
        assert not torch.equal(loader.batch(step=3, start=0, count=6)[0], inputs)
    row = BatchLoader(ByteCorpusSource(256, seed=0), 40).batch(0, 0, 1)[0][0]
    assert bytes(row.tolist()) in CORPUS_PATH.read_bytes()  # byte-level tokens of the text


@st.composite
def random_plans(draw) -> Plan:
    layers, pipelines, next_device = draw(st.integers(1, 6)), [], 0
    for _ in range(draw(st.integers(1, 3))):
        cuts = sorted(draw(st.sets(st.integers(1, layers - 1), max_size=layers - 1))) if layers > 1 else []
        sizes = [b - a for a, b in zip([0, *cuts], [*cuts, layers])]
        stages = []
        for n in sizes:
            tp = draw(st.sampled_from([1, 2, 4]))
            stages.append((list(range(next_device, next_device + tp)), n))
            next_device += tp
        pipelines.append((draw(st.integers(1, 4)), stages))
    return plan_of(*pipelines)


@settings(max_examples=60, deadline=None)
@given(random_plans())
def test_every_chunk_has_one_owner_per_pipeline_and_shards_split_evenly(plan: Plan):
    layout = rank_layout(plan)
    assert sorted(r for s in layout.stages for r in s.ranks) == list(range(layout.world_size))
    for unit in range(layout.num_layers + 2):
        groups = sorted((g for g in layout.chunk_groups if g.unit == unit), key=lambda g: g.chunk)
        finest = groups[0].num_chunks
        assert [g.chunk for g in groups] == list(range(finest))
        holders = [s for s in layout.stages if unit in s.units(layout.num_layers)]
        assert [s.pipeline for s in holders] == list(range(len(plan.pipelines)))
        assert finest == max(s.tp for s in holders)
        for p, holder in enumerate(holders):
            owners = [g.ranks[p] for g in groups]
            assert set(owners) <= set(holder.ranks)
            # each TP rank owns an equal, contiguous block of chunks, in TP-rank order
            assert owners == sorted(owners) and all(owners.count(r) == finest // holder.tp for r in holder.ranks)


def _four_device_problem(schedule: str = "1f1b"):
    from planner.hardware import Cluster, Machine
    from planner.problem import Problem
    from planner.workload import TrainingSpec

    cluster = Cluster(machines=[Machine(name="a", gpu="A100-80G", count=2, intra_bw_gbps=100),
                                Machine(name="b", gpu="MI250X", count=2, intra_bw_gbps=100)], inter_bw_gbps=1)
    model = ModelSpec(name="gqa", layers=4, hidden=32, heads=4, kv_heads=2, ffn_hidden=64, vocab=256)
    return Problem(name="four", cluster=cluster, model=model,
                   training=TrainingSpec(seq_len=16, global_batch=4, micro_batch=2, schedule=schedule))


TWO_MACHINES = plan_of((4, [([2, 3], 3), ([0], 1)]))  # ranks 0, 1 on machine b; rank 2 on machine a


AWAITING_RUNTIME: set[str] = set()  # every plan kind has its runtime (layered, sequence)


def test_every_planner_kind_has_a_runtime_in_its_own_folder():
    """Every plan kind has a runtime, except those listed as awaiting one: a new kind without
    a runtime, or a runtime that lands without this list shrinking, fails here."""
    from pathlib import Path

    from planner.kinds import PLAN_KINDS
    from runtime.kinds import RUNTIME_KINDS, runtime_of

    assert set(RUNTIME_KINDS) <= set(PLAN_KINDS)
    assert set(PLAN_KINDS) - set(RUNTIME_KINDS) == AWAITING_RUNTIME
    root = Path(__file__).resolve().parents[1] / "runtime"
    assert all((root / name / "__init__.py").is_file() for name in RUNTIME_KINDS)
    assert runtime_of(TWO_MACHINES).name == "layered"
    assert RUNTIME_KINDS["layered"].devices(TWO_MACHINES) == [2, 3, 0]


def test_an_unknown_plan_kind_is_a_clear_error():
    from runtime import make_job
    from runtime.errors import RunError
    from runtime.kinds import runtime_kind

    with pytest.raises(RunError, match="no runtime for plan kind 'hybrid'; the runtime runs: layered, sequence"):
        runtime_kind("hybrid")
    with pytest.raises(RunError, match="not a plan of any known kind"):
        make_job(_four_device_problem(), object())


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_the_job_runs_the_schedule_that_was_priced(schedule: str):
    from runtime import make_job

    problem = _four_device_problem(schedule)
    assert make_job(problem, TWO_MACHINES).config.schedule == schedule
    assert make_job(problem, TWO_MACHINES, schedule="gpipe").config.schedule == "gpipe"  # an override


def test_run_settings_hold_no_test_hooks_and_ranks_know_machine_and_vendor():
    from pydantic import ValidationError

    from planner.hardware import Vendor
    from runtime import make_job
    from runtime.communication.communicator import RankPlace
    from runtime.config import RunConfig
    from runtime.failure import FailureInjection
    from runtime.layered.worker import rank_places

    job = make_job(_four_device_problem(), TWO_MACHINES)
    with pytest.raises(ValidationError):
        RunConfig(model=job.config.model, seq_len=8, micro_batch=2, fail_rank=1)
    assert FailureInjection.model_validate_json(FailureInjection(rank=2, step=1).env()["HEXISCALE_INJECT_FAILURE"]) \
        == FailureInjection(rank=2, step=1, mode="kill")
    assert rank_places(job) == (RankPlace(2, 1, Vendor.amd), RankPlace(3, 1, Vendor.amd),
                                RankPlace(0, 0, Vendor.nvidia))
    assert rank_places(job.model_copy(update={"cluster": None}))[2] == RankPlace(0, None, Vendor.other)


def test_a_job_file_carries_the_cluster_once_and_reads_back_equal():
    import json

    from pydantic import ValidationError

    from runtime import make_job
    from runtime.config import Job

    problem = _four_device_problem()
    job = make_job(problem, TWO_MACHINES)
    text = job.model_dump_json()
    assert json.loads(text)["cluster"] is None and text.count('"intra_bw_gbps"') == 2  # two machines, once each
    back = Job.model_validate_json(text)
    assert back == job and back.cluster is back.problem.cluster and back.cluster == problem.cluster
    bare = Job(plan=job.plan, config=job.config, cluster=problem.cluster)  # no problem: the cluster is written
    assert Job.model_validate_json(bare.model_dump_json()).cluster == problem.cluster
    other = problem.cluster.model_copy(update={"inter_bw_gbps": 2.0})
    with pytest.raises(ValidationError, match="the job's cluster 'cluster' is not its problem's"):
        Job(plan=job.plan, config=job.config, cluster=other, problem=problem)


def test_a_sequence_plan_gets_the_sequence_runtime():
    from planner.io import load_plan, load_problem
    from runtime import make_job
    from runtime.kinds import runtime_of

    problem, plan = load_problem("longctx-tiny"), load_plan("longctx-tiny")
    assert runtime_of(plan).name == "sequence" and runtime_of(plan).devices(plan) == [0, 1, 2, 3]
    assert make_job(problem, plan).kind == "sequence"
