"""What a person training a model sees (docs/models-and-data.md §12): `--log-every` and the
ETA of the step lines, the loss curve `loss.png` (drawn by `hexiscale run` and by `hexiscale
show RUN_FOLDER`), and `hexiscale.run_plan(..., data=PATH, eval_data=PATH)` tokenizing as
`--data` does.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
from typer.testing import CliRunner

import hexiscale as hx
from hexiscale.cli import app
from hexiscale.viz.loss import draw_loss, moving_mean
from planner.layered.plan import Pipeline, Plan, Stage
from runtime.config import RunConfig
from runtime.metrics.progress import StepLines
from runtime.model.corpora import with_corpora
from runtime.model.data import CORPUS_PATH
from runtime.model.text import CACHE_ENV, DataError, prepare_stream
from planner.workload import ModelSpec
from hf_models import make_model, write_jsonl

GQA = ModelSpec(name="gqa", layers=4, hidden=32, heads=4, kv_heads=2, ffn_hidden=64, vocab=256)

PNG = b"\x89PNG\r\n\x1a\n"


def config(steps: int, log_every: int) -> RunConfig:
    return RunConfig(model=GQA, seq_len=8, micro_batch=1, steps=steps, log_every=log_every)


def record(step: int, wall_s: float = 1.0, **more) -> dict:
    return {"step": step + 1, "loss": 5.0 - step * 0.01, "tokens_per_s": 100.0, "wall_s": wall_s, **more}


def test_log_every_shows_the_first_every_nth_the_last_and_eval_steps():
    lines = StepLines(config(steps=10, log_every=4))
    shown = [step + 1 for step in range(10)
             if lines.note(record(step, **({"eval_loss": 4.0} if step == 5 else {})), step) is not None]
    assert shown == [1, 4, 6, 8, 10]
    resumed = StepLines(config(steps=10, log_every=4), first=6)  # a resumed run: its own first step
    assert [s + 1 for s in range(6, 10) if resumed.note(record(s), s) is not None] == [7, 8, 10]
    every = StepLines(config(steps=3, log_every=1))
    assert all(every.note(record(s), s) is not None for s in range(3))


def test_eta_is_the_steps_left_at_the_mean_step_after_the_warmup():
    lines = StepLines(config(steps=1000, log_every=100))
    assert lines.note(record(0, wall_s=9.0), 0).endswith("ETA 2.5 h")  # 999 steps at the only step's 9 s
    for step, wall in ((1, 5.0), (2, 1.0), (3, 3.0)):
        lines.note(record(step, wall_s=wall), step)
    assert lines.eta_s(3) == pytest.approx(996 * 2.0)  # steps 3 and 4 (after 2 warm-up steps): 2 s each
    two = StepLines(config(steps=2, log_every=1))
    assert "ETA" in two.note(record(0), 0)
    last = two.note(record(1, grad_norm=1.25, eval_loss=4.5), 1)
    assert "ETA" not in last and "grad norm 1.2500" in last and "eval loss 4.50000" in last


def test_moving_mean_and_a_long_noisy_curve_draw(tmp_path):
    assert moving_mean(np.array([1.0, 2.0, 3.0, 4.0]), 2).tolist() == [1.0, 1.5, 2.5, 3.5]
    records = [record(s, eval_loss=4.0) if s % 100 == 99 else record(s) for s in range(600)]
    path = draw_loss(records, tmp_path / "loss.png", "a long run")
    pixels = matplotlib.image.imread(path)
    assert path.read_bytes()[:8] == PNG and pixels.shape[1] > 800 and pixels[..., :3].std() > 0.05


@pytest.fixture(scope="module")
def model_work(tmp_path_factory):
    """A tiny llama folder, a problem of it, a one-device plan, train and eval text."""
    root = tmp_path_factory.mktemp("progress")
    patch = pytest.MonkeyPatch()
    patch.setenv(CACHE_ENV, str(root / "cache"))
    make_model(root / "llama", "llama")
    text = CORPUS_PATH.read_text()
    write_jsonl(root / "train.jsonl", text[: len(text) * 3 // 4])
    write_jsonl(root / "eval.jsonl", text[len(text) * 3 // 4:])
    (root / "llama.yaml").write_text(json.dumps({
        "name": "llama", "cluster": "demo-4", "model": {"hf": "llama"},
        "training": {"seq_len": 16, "global_batch": 2, "micro_batch": 1, "recompute": False, "token_block": 4}}))
    yield root
    patch.undo()


def test_run_plan_data_path_is_tokenized_as_data_is(model_work):
    problem = hx.load_problem(str(model_work / "llama.yaml"))
    settings = with_corpora(problem, "problem", 4, {"data": str(model_work / "train.jsonl"), "lr": 0.1})
    stream = prepare_stream(model_work / "train.jsonl", model_work / "llama", problem.model.vocab)
    assert settings == {"data": "text", "token_file": str(stream.path), "lr": 0.1}
    assert with_corpora(problem, "tiny", 4, {"data": "corpus"}) == {"data": "corpus"}  # named sources as given
    with pytest.raises(DataError, match="model='problem'"):
        with_corpora(problem, "tiny", 4, {"data": str(model_work / "train.jsonl")})
    with pytest.raises(DataError, match="missing.jsonl: no such file"):
        with_corpora(problem, "problem", 4, {"data": str(model_work / "missing.jsonl")})
    with pytest.raises(DataError, match="^eval_data: expected a text corpus"):
        with_corpora(problem, "problem", 4, {"eval_data": "corpus"})


@pytest.mark.slow
def test_run_plan_on_text_logs_every_nth_step_and_show_draws_its_folder(model_work, tmp_path):
    problem = hx.load_problem(str(model_work / "llama.yaml"))
    plan = Plan(pipelines=[Pipeline(batch=2, stages=[Stage(devices=[0], layers=4)])])
    out = tmp_path / "run"
    result = hx.run_plan(problem, plan, model="problem", steps=5, echo=False, out_dir=str(out), log_every=3,
                         data=str(model_work / "train.jsonl"), eval_data=str(model_work / "eval.jsonl"), eval_every=4,
                         clip_grad=1.0)
    assert [s["step"] for s in result.steps if "eval_loss" in s] == [4, 5]
    assert all(s["grad_norm"] > 0 for s in result.steps)
    printed = [line.split()[1] for line in (out / "rank0.log").read_text().splitlines() if line.startswith("step ")]
    assert printed == ["1/5", "3/5", "4/5", "5/5"]  # first, every 3rd, eval, last
    assert "ETA" in (out / "rank0.log").read_text()
    shown = CliRunner().invoke(app, ["show", str(out)])
    assert shown.exit_code == 0, shown.output
    assert (out / "loss.png").read_bytes()[:8] == PNG
    elsewhere = CliRunner().invoke(app, ["show", str(out), "-o", str(tmp_path / "pictures")])
    assert elsewhere.exit_code == 0 and (tmp_path / "pictures" / "loss.png").is_file()
    with_plan = CliRunner().invoke(app, ["show", str(out), "tiny-6-tiny"])
    assert with_plan.exit_code == 2 and "takes no plan" in with_plan.output


def test_show_of_a_folder_without_steps_or_without_a_plan_is_one_line(tmp_path):
    (tmp_path / "runlog.json").write_text("{}")
    result = CliRunner().invoke(app, ["show", str(tmp_path)])
    assert result.exit_code == 2 and "holds timings, not losses" in result.output
    (tmp_path / "steps.jsonl").write_text("not json\n")
    result = CliRunner().invoke(app, ["show", str(tmp_path)])
    assert result.exit_code == 2 and "steps.jsonl: not a run's step records" in result.output
    result = CliRunner().invoke(app, ["show", "tiny-6-tiny"])
    assert result.exit_code == 2 and "expected PROBLEM PLAN" in result.output
    assert "Traceback" not in result.output
    assert not list(Path(tmp_path).glob("*.png"))


@pytest.mark.parametrize("option, expected", [
    (["--clip-grad", "0"], "--clip-grad: Input should be greater than 0 (got 0.0)"),
    (["--clip-grad", "-1"], "--clip-grad: Input should be greater than 0"),
    (["--log-every", "0"], "--log-every"),
])
def test_bad_clip_grad_and_log_every_are_one_line(option, expected):
    result = CliRunner().invoke(app, ["run", "demo-tiny", "demo-tiny", *option])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and expected in text and "Traceback" not in text and "running" not in text
