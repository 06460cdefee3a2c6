"""Malformed input files (tests/data/bad/*): the CLI prints ONE line on stderr naming the file,
the field and the reason, exits with code 2, and never shows a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from hexiscale.cli import app

BAD = Path(__file__).parent / "data" / "bad"

# file → words the one-line error must contain (besides the file's own name)
CASES = {
    "cluster-missing-field.yaml": ["machines.1.intra_bw_gbps", "required"],
    "cluster-negative-bandwidth.yaml": ["inter_bw_gbps", "greater than 0", "-5"],
    "cluster-unknown-gpu.yaml": ["machines[0]", "unknown GPU type", "RTX9090"],
    "cluster-unknown-link-machine.yaml": ["links[0]", "unknown machine", "ghost"],
    "cluster-duplicate-machines.yaml": ["machine names must be unique", "m0"],
    "cluster-unknown-field.yaml": ["machines.0.intra_bandwidth", "unknown field"],
    "cluster-zero-count.yaml": ["machines.0.count", "greater than or equal to 1"],
    "model-zero-layers.yaml": ["layers", "greater than or equal to 1", "got 0"],
    "model-heads-not-divisible.yaml": ["hidden 100", "not divisible by heads 3"],
    "model-wrong-type.yaml": ["layers", "valid integer", "many"],
    "problem-batch-not-multiple.yaml": ["training", "global_batch 10", "multiple of micro_batch 4"],
    "problem-yaml-syntax.yaml": ["YAML syntax error", "line 4"],
    "problem-missing-training.yaml": ["training", "required"],
    "problem-unknown-cluster.yaml": ["cluster", "no-such-cluster"],
    "problem-unknown-field.yaml": ["optimizer", "unknown field"],
    "problem-top-level-list.yaml": ["expected a mapping", "list"],
    "problem-negative-seq-len.yaml": ["training.seq_len", "-128"],
    "problem-bad-inline-cluster.yaml": ["cluster.machines.0.count", "-1"],
    # the error is in the model file the problem refers to: that file is named
    "problem-bad-model-file.yaml": ["model-heads-not-divisible.yaml", "not divisible by heads"],
    "plan-json-syntax.json": ["JSON syntax error", "line 2"],
    "plan-wrong-format.json": ["format", "hexiscale.plan/1", "hexiscale.plan/0"],
    "plan-unknown-device.json": ["[device]", "pipeline 0 stage 0", "devices [99] do not exist"],
    "plan-zero-layers.json": ["pipelines.0.stages.0.layers", "greater than or equal to 1"],
    "plan-wrong-type.json": ["pipelines.0.batch", "valid integer", "eight"],
    "plan-unknown-field.json": ["pipelines.0.stages.0.tp", "unknown field"],
    "plan-top-level-list.json": ["expected a mapping", "list"],
    "plan-duplicate-device-in-stage.json": ["pipelines.0.stages.0.devices", "names a device twice"],
    # doubtful input that used to be accepted silently
    "cluster-duplicate-key.yaml": ["count", "duplicate key", "lines 6 and 7"],
    "plan-duplicate-key.json": ["batch", "duplicate key"],
    "cluster-infinite-bandwidth.yaml": ["inter_bw_gbps", "finite number", "inf"],
    "cluster-tiny-bandwidth.yaml": ["links.0.bw_gbps", "greater than 0.000001", "1e-09"],
    "cluster-conflicting-links.yaml": ["links[0] and links[1]", "m0", "m1", "25 vs 12.5 GB/s"],
    "problem-binary.yaml": ["not a text file", "UTF-8"],
    "plan-bool-device.json": ["pipelines.0.stages.0.devices", "device ids must be written as integers", "True"],
    "plan-string-device.json": ["pipelines.0.stages.0.devices", "device ids must be written as integers", "'0'"],
    "plan-huge-device.json": ["pipelines.0.stages.0.devices", "beyond any cluster", "9223372036854775808"],
    # every error of the file on the one line, not "(and 3 more)"
    "cluster-many-errors.yaml": ["machines.0.count", "machines.1.intra_bw_gbps", "machines.2.intra_bw_gbps",
                                 "required", "inter_bw_gbps"],
    # sequence plans (docs/sequence-plans.md §7), checked against longctx-tiny (s 1024, a 4, k 2, q 64, B 2)
    "seqplan-heads-sum.json": ["[heads]", "replica 0 group 0", "heads sum to 6", "a = 4"],
    "seqplan-heads-not-whole-kv.json": ["[heads]", "member 0 (device 0)", "heads 1 is not a positive multiple of a/k = 4/2 = 2"],
    "seqplan-tokens-not-block.json": ["[tokens]", "member 0 (device 0)", "tokens 500", "token block q = 64"],
    "seqplan-shards-sum.json": ["[shards]", "replica 0", "sum to 896 tokens", "s = 1024"],
    "seqplan-shard-odd-blocks.json": ["[shards]", "replica 0 group 0", "T_g = 576", "2q = 128"],
    "seqplan-device-twice.json": ["[device]", "device 0 is a member 2 times"],
    "seqplan-device-twice-in-group.json": ["replicas.0.ring.0.members", "names device 1 twice"],
    "seqplan-mixed-vendors.json": ["[vendor]", "replica 0 group 0", "nvidia devices [2]", "amd devices [3]"],
    "seqplan-unknown-device.json": ["[device]", "devices [9] do not exist"],
    "seqplan-batch-sum.json": ["[batch]", "replica batches sum to 3", "global batch is 2"],
    "seqplan-zero-heads.json": ["replicas.0.ring.0.members.0.heads", "greater than or equal to 1"],
    "seqplan-empty-ring.json": ["replicas.0.ring", "at least 1"],
    "seqplan-unknown-field.json": ["replicas.0.ring.0.members.0.kv", "unknown field"],
    "seqplan-string-tokens.json": ["replicas.0.ring.0.members.0.tokens", "must be written as integers", "'1024'"],
    "seqplan-problem-zero-token-block.yaml": ["training.token_block", "greater than or equal to 1"],
    # mixed vendors (docs/vendors.md §8); the layered plan is checked against tiny-mixed-4-tiny
    "cluster-unknown-vendor.yaml": ["gpu_types.0.vendor", "'nvidia', 'amd' or 'other'", "intel"],
    "cluster-negative-bridge.yaml": ["cross_vendor_bw_gbps", "greater than", "-10"],
    # found by a QA pass: a traceback (exit 3), a typo reported as a missing field, a model the run
    # could not build, a reserve no device can hold, an empty reference read as the folder "."
    "cluster-list-key.yaml": ["line 4", "a key is a list"],
    "problem-misspelled-training.yaml": ["trainig", "unknown field"],
    "model-odd-head-dim.yaml": ["head dimension", "60/4 = 15", "odd"],
    "problem-reserve-over-memory.yaml": ["training.reserved_gib", "500", "largest device's memory"],
    "problem-empty-cluster.yaml": ["cluster", "got ''"],
    "vendorplan-mixed-stage.json": ["[machine]", "pipeline 0 stage 1", "mixes nvidia and amd devices"],
}


def commands_for(name: str) -> list[list[str]]:
    """Plans are checked by validate and evaluate against demo-tiny (sequence plans against
    longctx-tiny); other files by validate."""
    path = str(BAD / name)
    if name.startswith("plan-"):
        return [["validate", "demo-tiny", path], ["evaluate", "demo-tiny", path]]
    if name.startswith("vendorplan-"):
        return [["validate", "tiny-mixed-4-tiny", path], ["evaluate", "tiny-mixed-4-tiny", path]]
    if name.startswith("seqplan-") and name.endswith(".json"):
        return [["validate", "longctx-tiny", path], ["evaluate", "longctx-tiny", path]]
    return [["validate", path]]


def test_every_bad_file_has_a_case():
    assert sorted(p.name for p in BAD.iterdir()) == sorted(CASES)
    assert len(CASES) >= 15


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_file_gives_one_line_exit_2(name):
    runner = CliRunner()
    for args in commands_for(name):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        line = lines[0]
        assert line.startswith("error: ")
        assert "Traceback" not in result.output and "Traceback" not in result.stderr
        named = "model-heads-not-divisible.yaml" if name == "problem-bad-model-file.yaml" else name
        assert named in line, line
        for word in CASES[name]:
            assert word in line, (word, line)


def test_missing_file_is_one_line():
    result = CliRunner().invoke(app, ["validate", str(BAD / "does-not-exist.yaml")])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {BAD / 'does-not-exist.yaml'}: no such file"]


def test_a_key_overriding_a_merged_one_is_no_duplicate(tmp_path):
    """`{<<: *m, name: n}` is what YAML merging is for; a key written twice is still refused."""
    from planner.io import load_cluster

    text = ("inter_bw_gbps: 3\nmachines:\n  - &m {name: m, gpu: H100, count: 1, intra_bw_gbps: 100}\n"
            "  - {<<: *m, name: n, count: 2}\n")
    (tmp_path / "c.yaml").write_text(text)
    cluster = load_cluster(tmp_path / "c.yaml")
    assert [(m.name, m.count) for m in cluster.machines] == [("m", 1), ("n", 2)]


@pytest.mark.parametrize("source, words", [
    ("instances/clusters/demo-4.yaml", "holds a cluster"), ("instances/models/tiny.yaml", "holds a model"),
    ("instances/plans/demo-tiny.json", "is a plan file (hexiscale.plan/1)")])
def test_another_kind_of_file_where_a_problem_is_expected_is_named(source, words, tmp_path):
    """`evaluate plan.json problem.yaml` (arguments swapped) said "cluster: field required"."""
    path = tmp_path / Path(source).name
    path.write_text((Path(__file__).parents[1] / source).read_text())
    result = CliRunner().invoke(app, ["solve", str(path), "-t", "1"])
    assert result.exit_code == 2 and words in result.stderr and "not a problem file" in result.stderr


@pytest.mark.parametrize("value", ['"false"', "0", "1.0", '"on"'])
def test_a_switch_takes_a_boolean_only(value, tmp_path):
    """QA: `recompute: "false"` (quoted) and `recompute: 0` had been read as switches."""
    path = tmp_path / "p.yaml"
    path.write_text(f"cluster: tiny-4\nmodel: tiny\ntraining: {{seq_len: 128, global_batch: 8, recompute: {value}}}\n")
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2 and "training.recompute: Input should be a valid boolean" in result.stderr


def test_a_training_section_alone_is_named_as_such(tmp_path):
    """QA: it was "read as a problem file (it has none of the fields …)", though `schema --type
    training` exists."""
    (tmp_path / "t.yaml").write_text("seq_len: 64\nglobal_batch: 8\n")
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "t.yaml")])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: {tmp_path / 't.yaml'}: this file holds training settings, not a problem " \
                                    f"file (a problem has cluster, model and training)"
