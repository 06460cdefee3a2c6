"""The long-context section of benchmarks/report/README.md (docs/sequence-plans.md §7, after HexiSeq): the
suites against the homogeneous baselines, the FLOP-matched comparison, and which plan kind
wins at which sequence length. Every number comes from the bench's rows.
"""

from __future__ import annotations

import statistics

from report_format import mean_text, number, size_text, times_text


def speedups(suites: list[dict], baseline: str) -> list[float]:
    """T_baseline / T_heuristic per suite where both have a plan (rows saved before
    seq-uniform-all existed have none for it)."""
    return [r[baseline] / r["heuristic"] for r in suites if r["heuristic"] and r.get(baseline)]


def sequence_suite_lines(suites: list[dict]) -> list[str]:
    """Heuristic vs seq-uniform (with the layout it chose), seq-uniform-all and seq-roundrobin:
    T and cross-machine traffic per suite."""
    lines = ["| problem | GPUs | heuristic T (s) | seq-uniform T | × | seq-uniform layout | seq-uniform-all T (old) "
             "| × (old) | seq-roundrobin T | × | cross-machine GB: heuristic | seq-roundrobin | heuristic / roundrobin |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in suites:
        h, u, old, rr = r["heuristic"], r["seq-uniform"], r.get("seq-uniform-all"), r["seq-roundrobin"]
        gh, gr = r["heuristic GB"], r["seq-roundrobin GB"]
        lines.append(f"| {r['problem']} | {r['gpus']} | {number(h, '.3f')} | {number(u, '.3f')} | {times_text(u, h)} | "
                     f"{r.get('seq-uniform layout', '—')} | {number(old, '.3f')} | {times_text(old, h)} | "
                     f"{number(rr, '.3f')} | {times_text(rr, h)} | {number(gh, '.1f')} | {number(gr, '.1f')} | "
                     f"{number(gh / gr if gh is not None and gr else None, '.2f')} |")
    return lines


def seqlen_lines(seqlen: list[dict]) -> list[str]:
    lines = ["| s | B | best layered T (s) | layered plan | best sequence T (s) | sequence plan | layered / sequence "
             "| winner | `--kind auto` |", "|---:|---:|---:|---|---:|---|---:|---|---|"]
    for r in seqlen:
        lt, st = r["layered_s"], r["sequence_s"]
        win = "none" if lt is None and st is None else "sequence" if lt is None or (st is not None and st < lt) else "layered"
        lplan = f"{r['layered_solver']}: {r['layered_shape']}" if lt is not None else f"infeasible ({r['layered_note']})"
        lines.append(f"| {size_text(r['seq_len'])} | {r['global_batch']} | {number(lt, '.3f')} | {lplan} | {number(st, '.3f')} | "
                     f"{r['sequence_solver']}: {r['sequence_shape']} | {times_text(lt, st)} | **{win}** | "
                     f"{r['auto_kind']} |")
    return lines


def _crossover(seqlen: list[dict]) -> str:
    wins = [r["seq_len"] for r in seqlen if r["sequence_s"] is not None
            and (r["layered_s"] is None or r["sequence_s"] < r["layered_s"])]
    if not wins:
        return "The sequence plan won at no length measured."
    first = min(wins)
    auto = min((r["seq_len"] for r in seqlen if r["auto_kind"] == "sequence"), default=None)
    text = f"The best sequence plan wins from s = {size_text(first)} on (every longer length measured: " \
           f"{'yes' if all(r['seq_len'] in wins for r in seqlen if r['seq_len'] >= first) else 'no'})."
    if auto is not None and auto != first:
        text += (f" `--kind auto` switches to sequence plans at {size_text(auto)} (its fixed seq_len rule, not tuned to this "
                 f"table), so between {size_text(first)} and {size_text(auto)} it picks the slower kind here: `hexiscale compare "
                 f"--kind sequence` shows both rows.")
    return text


def _sequence_differences(ups: list[float], traffic: list[float], suites: list[dict]) -> str:
    """Why our long-context figures differ from HexiSeq's, worded from the numbers."""
    silent = [r["problem"] for r in suites if r["heuristic GB"] == 0]
    larger = bool(ups) and statistics.mean(ups) > 1.36
    less = bool(traffic) and statistics.mean(traffic) < 0.7
    return (
        "Why ours differ: the clusters are simulated, with GUESSED bandwidths and datasheet peak FLOP/s "
        "(`instances/gpus.yaml`, `instances/clusters/longctx-*.yaml`), and T is our cost model, not a measured "
        "run on HexiSeq's testbed. " + ("Our speed-ups are larger than the paper's. " if larger else
                                        "Our speed-ups are within or below the paper's range. ")
        + "In our model a device's speed is its peak FLOP/s (H100 989 vs A100 312 TFLOP/s: 3.2×; V100 125), "
        "and seq-uniform-all gives every group of the whole cluster an equal shard, equal heads and an equal "
        "batch, so the slowest GPU type sets the pace of the whole ring; seq-uniform may leave the slow types "
        "idle, so against it the heuristic gains only what sizing shards by speed adds over the best uniform "
        "device set; measured kernels on real GPUs are likely closer in speed than their datasheets (not "
        "measured here), which would shrink the gap, and the summary of the paper we have does not say how "
        "its homogeneous baselines were configured. "
        + ("Our traffic saving is larger than the paper's ~30 %: " if less else "Traffic: ")
        + "we count only the HP all-to-all and CP ring bytes that cross machines (ZeRO and DP traffic are the "
        "same for every plan), and the heuristic builds its groups and rings from fast-link device sets, so a "
        "ring kept inside one machine sends nothing across" + (f" (0 GB on {', '.join(silent)})" if silent else "")
        + ", where round-robin spreads every ring over machines. Nothing was tuned to match the paper's figures.")


def speedup_lines(suites: list[dict]) -> list[str]:
    """The heuristic's speed-ups over the new and the old uniform reference, and where it loses
    to the uniform layout, which layouts the two chose."""
    ups, old_ups = speedups(suites, "seq-uniform"), speedups(suites, "seq-uniform-all")
    lost = [r for r in suites if r["heuristic"] and r["seq-uniform"] and r["seq-uniform"] < r["heuristic"]]
    best = lambda xs: number(max(xs, default=None), ".2f")  # noqa: E731
    text = (f"Heuristic over seq-uniform: mean {mean_text(ups)}×, best {best(ups)}×, worst "
            f"{number(min(ups, default=None), '.2f')}× over {len(ups)} settings; over seq-uniform-all (the old "
            f"reference): mean {mean_text(old_ups)}×, best {best(old_ups)}× (HexiSeq: 1.11–1.36× on average, 1.72× best, "
            f"over homogeneous baselines).")
    if lost:
        text += (f" The heuristic is slower than seq-uniform on {len(lost)} of {len(ups)}: "
                 + "; ".join(f"{r['problem']} (heuristic {r.get('heuristic layout', '—')}, seq-uniform "
                             f"{r.get('seq-uniform layout', '—')})" for r in lost)
                 + ": its coarse placement keeps slower devices or a larger HP degree that the best uniform layout "
                 "on the fastest type does without.")
    return [text, ""]


def flop_matched_lines(rows: list[dict]) -> list[str]:
    """The mixed cluster against a homogeneous H100 cluster of (nearly) the same peak FLOP/s."""
    if not rows:
        return []
    lines = ["| problem | GPUs | twin H100s | F_het / F_hom | T mixed (s) | T homogeneous (s) | ratio |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "—" if r["ratio"] is None else f"{r['ratio']:.3f}"
        lines.append(f"| {r['problem']} | {r['gpus']} | {r['twin_gpus']} | {r['flops_ratio']:.3f} | "
                     f"{number(r['hetero_s'], '.3f')} | {number(r['homo_s'], '.3f')} | {ratio} |")
    return ["FLOP-matched homogeneous comparison (HexiSeq: the mixed cluster within 3 % of a homogeneous one of "
            "equal FLOP/s). ratio = T_mixed · (F_mixed / F_homogeneous) / T_homogeneous, so 1.00 means the mixed "
            "cluster is used as well as the uniform one; below 1 it does better (it also has more devices and "
            "memory).", "", *lines]


def sequence_section(sequence: dict | None) -> list[str]:
    """The long-context section: HexiSeq's comparisons beside ours, and which plan kind wins at
    which sequence length."""
    if not sequence:
        return []
    suites, seqlen = sequence.get("suites", []), sequence.get("seqlen", [])
    matched = sequence.get("flop_matched", [])
    ups = speedups(suites, "seq-uniform")
    traffic = [r["heuristic GB"] / r["seq-roundrobin GB"] for r in suites
               if r["heuristic GB"] is not None and r["seq-roundrobin GB"]]
    return [
        "## Long context: sequence plans (docs/sequence-plans.md §7, after HexiSeq)",
        "",
        "`benchmarks/bench_sequence.py` (the suites) and `benchmarks/bench_seqlen.py` (the sequence-length "
        "table); every T is the evaluator of its plan kind. **heuristic** is HexiSeq's two-stage scheduler, "
        "**seq-uniform** what a careful user runs by hand with Megatron CP / USP / Ulysses (D equal replicas "
        "of G equal groups of n members, equal shards, heads and batches), the best over n, D, G and over the "
        "device sets a user would try (the fastest t GPU types, each type alone; slow types may idle, as in the "
        "layered `symmetric`): the column *seq-uniform layout* says which; **seq-uniform-all** the same on the "
        "whole cluster in file order (the reference of earlier reports); **seq-roundrobin** seq-uniform-all's "
        "shapes dealt round-robin over the machines.",
        "",
        *sequence_suite_lines(suites),
        "",
        *speedup_lines(suites),
        f"Cross-machine HP + CP traffic, heuristic / seq-roundrobin: mean {mean_text(traffic)} (HexiSeq: about 0.7, "
        f"i.e. ~30 % less).",
        "",
        _sequence_differences(ups, traffic, suites),
        "",
        *flop_matched_lines(matched),
        "",
        "### Which plan kind wins at which sequence length",
        "",
        "llama3-8b on longctx-h100-a100 (2 × 8 H100 + 2 × 8 A100-80G, bandwidths guessed), about 2^20 tokens per "
        "iteration (B = 2^20 / s). Best layered = the better of the layered heuristic and symmetric "
        "(docs/plan-space.md §2, docs/cost-model.md §3: pipelines of layers, TP, DP; the whole sequence on every stage); best sequence = the better of "
        "the sequence heuristic and seq-uniform.",
        "",
        *seqlen_lines(seqlen),
        "",
        _crossover(seqlen) + " A layered plan holds whole sequences per stage, so its activation memory and "
        "s² attention grow per device until, at 1M tokens, no stage fits. HexiSeq covers CP and HP only (its "
        "limitations list TP and PP as not covered), so this table has no paper figure beside it.",
        "",
    ]
