"""Random plans of random tiny Hugging Face models, trained by `hexiscale run` and by
transformers' one-process loop (the independent judge; docs/models-and-data.md §12): the fixed
combinations of test_hf_training.py, widened by a generator over the parts a plan and a model
combine — Llama or Qwen2 (q/k/v biases), MHA, GQA or MQA, tied or untied embeddings, 1–5
layers, rope and norm constants; one to three pipelines of uneven layer splits and TP 1, 2 or
4 on two machines; sequence parallelism, ZeRO-1, recompute, GPipe or 1F1B, micro-batches of 1
or 2, gradient clipping; and sequence plans of one or two replicas, rings of one or two groups,
head- and context-parallel members of uneven token shards. Per-step losses and the saved
weights equal the loop's to 1e-5, at lr 1e-3 (a QA pass ran 96 such fp32 cases, layered and
sequence plans, at lr 1e-3 and 3e-3: all within 1e-5 but two at 3e-3, at 2–3e-5, where the fp32
loop itself lay as far from an fp64 one: AdamW's step on near-zero gradients amplifies the order
of a sum).
"""

from __future__ import annotations

import json
import random

import pytest
import torch
import yaml
from typer.testing import CliRunner

from hexiscale.cli import app
from runtime.model.data import CORPUS_PATH
from runtime.model.text import CACHE_ENV
from hf_models import make_model, relative_distance, stream_of, train_transformers, write_jsonl

STEPS, S, LR, WD = 2, 16, 1e-3, 0.01
CLUSTER = {"name": "two-machines", "inter_bw_gbps": 1.25,
           "machines": [{"name": "a", "gpu": "A100-80G", "count": 4, "intra_bw_gbps": 16},
                        {"name": "b", "gpu": "RTX4090", "count": 2, "intra_bw_gbps": 16}]}
SEEDS = range(6)
SEQUENCE_SEEDS = range(3)


def model_config(r: random.Random) -> tuple[str, dict]:
    """A family and config.json fields: a/k of 1, 2 or 4 (MQA included), head dim 4–16."""
    kv = r.choice([1, 2, 4])
    heads = kv * r.choice([1, 2, 4]) if kv < 4 else 4
    head_dim = r.choice([4, 8, 16]) if heads <= 4 else r.choice([4, 8])
    return r.choice(["llama", "qwen2"]), {
        "hidden_size": heads * head_dim, "num_attention_heads": heads, "num_key_value_heads": kv,
        "intermediate_size": r.choice([32, 48, 64]), "num_hidden_layers": r.randint(1, 5),
        "vocab_size": 320, "rope_theta": r.choice([500.0, 10000.0, 1e6]), "rms_norm_eps": r.choice([1e-6, 1e-3])}


def layered_plan(r: random.Random, heads: int, kv: int, layers: int, micro: int) -> dict:
    """One to three pipelines, each of 1–3 stages with uneven layers, each stage a TP group
    inside one machine (TP sizes that split the heads), within the 4 + 2 devices."""
    free, pipelines = [[0, 1, 2, 3], [4, 5]], []
    sizes = [t for t in (1, 2, 4) if heads % t == 0 and kv % t == 0]
    for _ in range(r.choice([1, 2, 3])):
        split = parts(r, layers, r.randint(1, min(3, layers)))
        taken, stages = [list(m) for m in free], []
        for n in split:
            fits = [(t, m) for t in sizes for m in (0, 1) if len(taken[m]) >= t]
            if not fits:
                break
            t, m = r.choice(fits + [f for f in fits if f[0] > 1] * 2)  # TP groups twice as likely
            stages.append({"devices": taken[m][:t], "layers": n})
            taken[m] = taken[m][t:]
        if len(stages) < len(split):
            break
        free = taken
        pipelines.append({"batch": micro * r.randint(1, 2), "stages": stages})
    return {"format": "hexiscale.plan/1", "problem": "random", "pipelines": pipelines}


def random_case(seed: int) -> dict:
    r = random.Random(seed)
    family, config = model_config(r)
    micro = r.choice([1, 2])
    plan = {"pipelines": []}
    while not plan["pipelines"]:  # (a first pipeline whose TP groups took every device before its last stage)
        plan = layered_plan(r, config["num_attention_heads"], config["num_key_value_heads"],
                            config["num_hidden_layers"], micro)
    training = {"seq_len": S, "micro_batch": micro, "global_batch": sum(p["batch"] for p in plan["pipelines"]),
                "recompute": r.random() < 0.5, "sequence_parallel": r.random() < 0.5,
                "zero_stage": r.choice([0, 1]), "schedule": r.choice(["1f1b", "gpipe"])}
    return {"family": family, "config": config, "tied": r.random() < 0.4, "plan": plan, "training": training,
            "clip": r.choice([None, 0.5])}


def parts(r: random.Random, total: int, count: int) -> list[int]:
    """`count` positive integers summing to `total`, cut at random."""
    cuts = sorted(r.sample(range(1, total), count - 1))
    return [b - a for a, b in zip([0] + cuts, cuts + [total])]


def sequence_plan(r: random.Random, heads: int, kv: int, block: int) -> dict:
    """One or two replicas, each a ring of one or two groups whose shards T_g (multiples of 2q)
    cover s; a group's members hold whole kv heads (multiples of a/k, summing to a) and
    multiples of q tokens, on devices of either machine (docs/sequence-plans.md §7.1)."""
    devices, replicas = r.sample(range(6), 6), []
    for _ in range(r.choice([1, 2])):
        shards = [2 * block * n for n in parts(r, S // (2 * block), r.randint(1, 2))]
        if len(devices) < len(shards):
            break
        ring = []
        for g, shard in enumerate(shards):
            spare = len(devices) - (len(shards) - g - 1)  # a device for each group after this one
            count = r.randint(1, min(kv, shard // block, spare, 3))
            ring.append({"members": [{"device": devices.pop(), "heads": h * heads // kv, "tokens": block * t}
                                     for h, t in zip(parts(r, kv, count), parts(r, shard // block, count))]})
        replicas.append({"batch": r.randint(1, 2), "ring": ring})
    return {"format": "hexiscale.seqplan/1", "problem": "random", "replicas": replicas}


def random_sequence_case(seed: int) -> dict:
    r = random.Random(seed)
    family, config = model_config(r)
    block = r.choice([2, 4])
    plan = sequence_plan(r, config["num_attention_heads"], config["num_key_value_heads"], block)
    training = {"seq_len": S, "micro_batch": 1, "token_block": block, "recompute": r.random() < 0.5,
                "global_batch": sum(p["batch"] for p in plan["replicas"])}
    return {"family": family, "config": config, "tied": r.random() < 0.4, "plan": plan, "training": training,
            "clip": r.choice([None, 0.5])}


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    root = tmp_path_factory.mktemp("random-plans")
    patch = pytest.MonkeyPatch()
    patch.setenv(CACHE_ENV, str(root / "cache"))
    yield write_jsonl(root / "text.jsonl", CORPUS_PATH.read_text())
    patch.undo()


def test_the_generator_reaches_what_it_says(tmp_path):
    """Over the suite's seeds and a wider set, every part the docstring names occurs (so the six
    seeds the suite trains are not all alike)."""
    cases = [random_case(s) for s in range(60)]
    stage_sizes = {len(s["devices"]) for c in cases for p in c["plan"]["pipelines"] for s in p["stages"]}
    assert stage_sizes == {1, 2, 4}
    assert {len(c["plan"]["pipelines"]) for c in cases} == {1, 2, 3}
    assert {c["config"]["num_key_value_heads"] == 1 and c["config"]["num_attention_heads"] > 1 for c in cases} == {True, False}
    assert {c["family"] for c in cases} == {"llama", "qwen2"} and {c["tied"] for c in cases} == {True, False}
    rings = [r["ring"] for s in range(60) for r in random_sequence_case(s)["plan"]["replicas"]]
    assert {len(ring) for ring in rings} == {1, 2} and any(len(g["members"]) > 1 for ring in rings for g in ring)
    assert {len(random_sequence_case(s)["plan"]["replicas"]) for s in range(60)} == {1, 2}
    seeds = [random_case(s) for s in SEEDS]
    assert any(len(c["plan"]["pipelines"]) > 1 and c["training"]["zero_stage"] == 1 for c in seeds)
    assert any(any(len(s["devices"]) > 1 for p in c["plan"]["pipelines"] for s in p["stages"])
               and c["training"]["sequence_parallel"] for c in seeds)


@pytest.mark.slow
@pytest.mark.parametrize("kind, seed", [("layered", s) for s in SEEDS] + [("sequence", s) for s in SEQUENCE_SEEDS])
def test_a_random_plan_trains_as_transformers_does(text, tmp_path, kind, seed):
    case = random_case(seed) if kind == "layered" else random_sequence_case(seed)
    folder = make_model(tmp_path / "model", case["family"], tied=case["tied"], seed=seed, **case["config"])
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"name": "random", "cluster": CLUSTER, "model": {"hf": "model"},
                                                     "training": case["training"]}))
    (tmp_path / "plan.json").write_text(json.dumps(case["plan"]))
    clip = ["--clip-grad", case["clip"]] if case["clip"] else []
    result = CliRunner().invoke(app, ["run", *map(str, [
        tmp_path / "p.yaml", tmp_path / "plan.json", "--init-from", folder, "--data", text, "--steps", STEPS,
        "--lr", LR, "--weight-decay", WD, "--save-hf", tmp_path / "saved", "--out", tmp_path / "out", *clip])])
    assert result.exit_code == 0, (case, result.output)
    losses = [s["loss"] for s in json.loads((tmp_path / "out" / "metrics.json").read_text())["steps"]]
    reference, model = train_transformers(folder, stream_of(text, folder), steps=STEPS,
                                          global_batch=case["training"]["global_batch"], seq_len=S, lr=LR,
                                          weight_decay=WD, clip_grad=case["clip"])
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(losses, reference)), (case, losses, reference)
    from transformers import AutoModelForCausalLM

    saved = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "saved", dtype=torch.float32).state_dict())
    assert relative_distance(saved, dict(model.state_dict())) <= 1e-5, case
