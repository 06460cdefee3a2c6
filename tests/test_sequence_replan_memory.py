"""The sequence re-plan's repair under memory (docs/checkpoints.md §10, solvers/sequence/replan.py):
the capped deal by hand (water-filling); a fast small-memory device that the plain deal by
speed overfills, capped so that the slow large one takes the rest; a loss no deal can hold,
said in the re-plan's reason; and on seeded random problems (tests/test_sequence_solvers.py's
generators, every loss of one or two used devices) a repair that is offered always passes the
validator, memory included, and places every surviving token and sequence."""

from __future__ import annotations

import itertools

import pytest

import hexiscale as hx
from planner.hardware import Cluster, GpuType, Machine
from planner.problem import Problem
from planner.sequence.plan import SeqPlan
from planner.workload import ModelSpec, TrainingSpec
from solvers.common import SolverOptions
from solvers.replan import survivors
from solvers.repair_parts import deal_capped
from solvers.sequence import heuristic
from solvers.sequence.replan import NoRoom, repair
from test_sequence_solvers import hetero_seq, tiny_seq

MODEL = ModelSpec(name="small", layers=2, hidden=512, heads=8, kv_heads=4, ffn_hidden=1024, vocab=1000)
SEEDS = range(30)


def fast_and_slow(seq_len: int) -> Problem:
    """Machine f: devices 0, 1 (900 TFLOP/s, 3 GiB); machine s: device 2 (100 TFLOP/s, 80 GiB)."""
    types = (GpuType(name="fast", peak_tflops=900, memory_gib=3), GpuType(name="slow", peak_tflops=100, memory_gib=80))
    cluster = Cluster(machines=[Machine(name="f", gpu="fast", count=2, intra_bw_gbps=400),
                                Machine(name="s", gpu="slow", count=1, intra_bw_gbps=400)],
                      inter_bw_gbps=25, gpu_types=types)
    return Problem(name="fast-slow", cluster=cluster, model=MODEL,
                   training=TrainingSpec(seq_len=seq_len, global_batch=2, micro_batch=1, token_block=1024))


def rules(problem: Problem, plan: SeqPlan) -> set[str]:
    return {v.rule for v in hx.validate(problem, plan)}


def shares(plan: SeqPlan) -> list:
    return [(r.batch, [[(m.device, m.heads, m.tokens) for m in g.members] for g in r.ring]) for r in plan.replicas]


def test_capped_deal_by_hand_fills_what_has_room_and_says_when_nothing_does():
    """Speeds 1 and 3, caps 6 and 2: by speed alone 2/6; the second load is full at 2, so the
    rest goes to the first (water-filling). 9 units do not fit under caps summing to 8."""
    caps = [6, 2]

    def take(moves, loads):
        grown = list(loads)
        for j, size in moves:
            grown[j] += size
        if all(x <= c for x, c in zip(grown, caps)):
            loads[:] = grown
            return True
        return False

    loads = [0, 0]
    assert deal_capped([0, 0], [1.0, 3.0], 8, 1, lambda moves: take(moves, loads)) == [6, 2] == loads
    loads = [0, 0]
    assert deal_capped([0, 0], [1.0, 3.0], 9, 1, lambda moves: take(moves, loads)) is None


def test_the_fast_small_device_takes_what_its_memory_holds_and_the_slow_one_the_rest():
    """Groups of one member: devices 0 and 1 (fast) with 30720 tokens each, device 2 (slow)
    with 4096. Device 1 lost: by speed (9:1) the plain deal gives device 0 59392 tokens, over
    its 3 GiB; the repair gives it what fits — one more shard of 2q would not — and device 2
    the rest. (The repair before memory was capped returned the plan over memory.)"""
    problem = fast_and_slow(65536)
    old = SeqPlan.from_rings(problem="fast-slow", batches=[2],
                             rings=[[[(0, 8, 30720)], [(1, 8, 30720)], [(2, 8, 4096)]]])
    assert hx.validate(problem, old) == []
    new, mapping = survivors(problem, {1})
    plain, _ = repair(problem, old, new, mapping, capped=False)
    assert shares(plain) == [(2, [[(0, 8, 59392)], [(1, 8, 6144)]])] and rules(new, plain) == {"memory"}
    fixed, changes = repair(problem, old, new, mapping)
    assert hx.validate(new, fixed) == [], hx.validate(new, fixed)
    ((batch, ring),) = shares(fixed)
    (fast, slow) = [group[0][2] for group in ring]
    assert batch == 2 and [[m[:2] for m in group] for group in ring] == [[(0, 8)], [(1, 8)]]
    assert fast + slow == 65536 and slow > 6144
    one_more = SeqPlan.from_rings(problem=new.name, batches=[2], rings=[[[(0, 8, fast + 2048)], [(1, 8, slow - 2048)]]])
    assert rules(new, one_more) == {"memory"}
    assert any(f"shards now {fast}/{slow}" in c for c in changes), changes


def test_replan_says_when_no_repair_fits_in_memory():
    """Devices 0 and 1 (fast, 3 GiB) hold 30720 tokens each; device 2 (slow, 80 GiB) is idle on
    another machine, so no stand-in. Device 1 lost: device 0 alone cannot hold the sequence, and
    a polish of the plain deal has no other device to move to: no repaired candidate, and the
    reason says so; the fresh solve (which uses device 2) is chosen."""
    problem = fast_and_slow(61440)
    old = SeqPlan.from_rings(problem="fast-slow", batches=[2], rings=[[[(0, 8, 30720)], [(1, 8, 30720)]]])
    assert hx.validate(problem, old) == []
    new, mapping = survivors(problem, {1})
    with pytest.raises(NoRoom, match="cannot hold the 61440-token sequence"):
        repair(problem, old, new, mapping)
    result = hx.replan(problem, old, [1], options=SolverOptions(time_limit_s=3))
    assert result.repaired_s is None and result.chosen == "heuristic"
    why = result.repaired_why
    assert why.startswith("no memory-feasible repair: replica 0: its survivors' memory cannot hold"), why
    assert hx.validate(result.problem, result.plan) == []


def losses(problem: Problem, plan: SeqPlan):
    """Every set of one or two of the plan's devices that leaves a survivor in the cluster."""
    used = sorted(set(plan.devices))
    for count in (1, 2):
        for lost in itertools.combinations(used, count):
            if len(lost) < problem.cluster.num_devices:
                yield set(lost)


@pytest.fixture(scope="module")
def random_cases():
    """(problem, the heuristic's plan) of every seeded tiny and hetero problem it finds a plan for."""
    out = []
    for make, seed in itertools.product((tiny_seq, hetero_seq), SEEDS):
        problem = make(seed)
        plan = heuristic.solve(problem, SolverOptions(time_limit_s=1)).plan
        if plan is not None:
            out.append((problem, plan))
    return out


def check_offered(problem: Problem, old: SeqPlan, new: Problem, mapping: dict, fixed: SeqPlan, changes: list[str]):
    """The repaired plan passes the validator (memory included); every replica holds the whole
    sequence and the batches the global batch; a survivor of the old plan is missing only when
    its replica's drop is said."""
    assert hx.validate(new, fixed) == [], (new.name, hx.validate(new, fixed))
    assert all(r.tokens == new.training.seq_len for r in fixed.replicas)
    assert fixed.global_batch == new.training.global_batch
    for r, replica in enumerate(old.replicas):
        alive = {mapping[d] for d in replica.devices if d in mapping}
        if not alive <= set(fixed.devices):
            assert any(c.startswith(f"replica {r} dropped (no memory-feasible repair") for c in changes), changes


def test_every_offered_repair_passes_the_validator_on_random_problems(random_cases):
    """Seeded tiny and hetero problems, every loss of one or two used devices: the repair is a
    valid plan (rules 1–5) placing every token and sequence, or NoRoom with its reason, which
    only a plain deal over memory gets; and where the plain deal fits, the repair is that deal."""
    offered = refused = 0
    for problem, old in random_cases:
        for lost in losses(problem, old):
            new, mapping = survivors(problem, lost)
            plain, _ = repair(problem, old, new, mapping, capped=False)
            try:
                fixed, changes = repair(problem, old, new, mapping)
            except NoRoom as error:
                assert str(error) and "memory" in rules(new, plain), (new.name, error)
                refused += 1
                continue
            if fixed is None:
                assert plain is None
                continue
            check_offered(problem, old, new, mapping, fixed, changes)
            if plain is not None and not hx.validate(new, plain):
                assert shares(fixed) == shares(plain)
            offered += 1
    assert offered > 50 and refused > 10, (offered, refused)  # the cases tell the two apart


def test_the_redeal_fits_where_the_greedy_deal_filled_the_fast_groups_first():
    """12 GPUs of three types, Llama-2 13B at 256K, device 4 lost (from a QA pass): the greedy
    deal filled the L40S groups to the brim, then took the A100 groups for full (growing them
    grows the ring buffers on the full L40S) and said 'cannot hold the sequence'; the memory fit
    of the heuristic's coarse stage deals the same survivors, and the repair is a candidate."""
    from instances.generate import generate_cluster, generated_problem

    base = generated_problem(generate_cluster(12, "A100-80G:0.25,L40S:0.25,RTX4090:0.5", seed=45), "llama2-13b",
                             seq_len=262144, global_batch=4)
    problem = base.model_copy(update={"training": base.training.model_copy(update={"token_block": 128})})
    plan = heuristic.solve(problem, SolverOptions(time_limit_s=5, progress=False)).plan
    result = hx.replan(problem, plan, [4], options=SolverOptions(time_limit_s=5, progress=False))
    assert result.repaired_why == "" and result.repaired_s is not None, result.repaired_why
    assert result.repaired_s <= result.fresh_s * (1 + 1e-9)
