"""Bundled instances load (and bundled plans validate); the paper clusters have the paper's
composition; the cluster generator keeps its promises."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from instances.generate import allocate_units, generate_cluster, generated_problem, parse_mix
from planner import load_plan, load_problem, validate
from planner.io import bundled_names, load_cluster, load_model

AGREED_PROBLEMS = [
    "demo-tiny", "small-8-llama2-7b", "small-16-llama2-13b", "medium-32-llama2-13b",
    "hetero1-llama2-7b", "hetero1-llama2-13b", "hetero2-llama2-7b", "hetero2-llama2-13b",
    "hetero3-llama-30b", "case-study-llama2-13b", "homo-a800-2x8-llama2-7b",
    "homo-a800-2x8-llama2-13b", "homo-a800-4x8-llama-30b", "h800-h20-16-16-llama2-70b",
    "h800-h20-16-24-llama2-70b", "h800-h20-16-32-llama2-70b",
]


def gpus_by_type(cluster) -> dict[str, int]:
    out = Counter()
    for m in cluster.machines:
        out[m.gpu] += m.count
    return dict(out)


@pytest.mark.parametrize("name", bundled_names("problems"))
def test_bundled_problem_loads(name):
    problem = load_problem(name)
    assert problem.name == name
    assert problem.training.global_batch % problem.training.micro_batch == 0


def test_agreed_names_exist_and_tiny_problems_are_small():
    names = bundled_names("problems")
    assert set(AGREED_PROBLEMS) <= set(names)
    tiny = [n for n in names if n.startswith("tiny-")]
    assert len(tiny) >= 3
    assert all(2 <= load_problem(n).cluster.num_devices <= 6 for n in tiny)
    assert load_problem("demo-tiny").cluster.num_devices <= 4


@pytest.mark.parametrize("name", bundled_names("plans"))
def test_bundled_plan_validates_for_its_problem(name):
    plan = load_plan(name)
    assert validate(load_problem(plan.problem), plan) == []


def test_demo_plan_is_asymmetric():
    plan = load_plan("demo-tiny")
    assert len(plan.pipelines) == 2 and len(set(p.batch for p in plan.pipelines)) == 2
    assert {s.tp for p in plan.pipelines for s in p.stages} == {1, 2}


def test_paper_clusters_have_the_paper_composition():
    assert gpus_by_type(load_cluster("hetero-1")) == {"RTX3080Ti": 8, "RTX3090": 8, "RTX4090": 24}
    assert gpus_by_type(load_cluster("hetero-2")) == {"RTX3080Ti": 8, "RTX3090": 8, "RTX4090": 24, "A800-80G": 8}
    h3 = load_cluster("hetero-3")
    assert gpus_by_type(h3) == {"RTX3090": 16, "RTX4090": 32, "A800-80G": 8}
    assert sorted(m.count for m in h3.machines if m.gpu == "RTX3090") == [4, 4, 8]
    assert gpus_by_type(load_cluster("homo-a800-4x8")) == {"A800-80G": 32}
    for h20 in (16, 24, 32):
        assert gpus_by_type(load_cluster(f"h800-h20-16-{h20}")) == {"H800": 16, "H20": h20}
    # NVLink machines are far faster inside than the Ethernet between machines
    case = load_cluster("case-study")
    assert case.bw_matrix[0, 0] == 400 and case.bw_matrix[0, 1] < 16
    # paper's "same theoretical FLOPS": Hetero-1 vs 2×8 A800 within a few percent (+1.36 % claimed)
    ratio = load_cluster("hetero-1").total_peak_flops / load_cluster("homo-a800-2x8").total_peak_flops
    assert 0.95 < ratio < 1.05


def test_published_model_sizes():
    # parameter counts of the published checkpoints, within 1 % (no rotary/bias terms here)
    for name, billions in (("llama2-7b", 6.74), ("llama2-13b", 13.0), ("llama2-70b", 69.0),
                           ("llama-30b", 32.5), ("llama3-8b", 8.03)):
        assert load_model(name).total_params / 1e9 == pytest.approx(billions, rel=0.01)


@pytest.mark.parametrize("gpus,seed", [(4, 0), (8, 1), (64, 2), (512, 3)])
def test_generated_cluster_shape(gpus, seed):
    mix = "A100-80G:0.25,RTX4090:0.5,H20:0.25"
    cluster = generate_cluster(gpus, mix, seed)
    assert cluster == generate_cluster(gpus, mix, seed)
    assert cluster.num_devices == gpus
    assert {m.count for m in cluster.machines} <= {4, 8}
    weights = parse_mix(mix)
    for gpu, n in gpus_by_type(cluster).items():
        assert abs(n - gpus * weights[gpu]) <= 4  # largest remainder: within one 4-GPU unit
    if len(cluster.machines) > 2:  # uneven: rack links, degraded pairs and the slow default
        off_diagonal = cluster.bw_matrix[~np.eye(len(cluster.machines), dtype=bool)]
        assert len(set(off_diagonal.tolist())) >= 2


def test_generator_rejects_bad_arguments():
    for gpus, mix in ((6, "H20:1"), (0, "H20:1"), (8, "B300:1"), (8, "H20"), (8, "H20:-1,A10:1"), (8, "")):
        with pytest.raises(ValueError):
            generate_cluster(gpus, mix, 0)
    assert allocate_units(10, {"a": 0.5, "b": 0.25, "c": 0.25}) == {"a": 5, "b": 3, "c": 2}


def test_generated_problem_defaults():
    problem = generated_problem(generate_cluster(128, "H800:1,H20:1", 0), "llama2-70b", micro_batch=2)
    assert problem.training.global_batch == 128 and problem.model.kv_heads == 8
