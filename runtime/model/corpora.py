"""The run settings of text corpora (docs/models-and-data.md §12), shared by `hexiscale run
--data PATH --eval-data PATH` and `hexiscale.run_plan(..., data=PATH, eval_data=PATH)`: each
corpus tokenized with the problem's model folder's tokenizer.json (once; the cache after
that) and checked to hold a sequence, before any process starts. No torch."""

from __future__ import annotations

from collections.abc import Callable

from planner.problem import Problem
from planner.workload import ModelSpec
from runtime.model.text import DataError, prepare_stream

NAMED_SOURCES = ("synthetic", "corpus")  # token sources that are not files (runtime.model.data)


def corpus_settings(model: ModelSpec, data: str, eval_data: str | None, eval_every: int, steps: int, seq_len: int,
                    log: Callable[[str], None] | None = None, names: tuple[str, str] = ("data", "eval_data")) -> dict:
    """{data: 'text', token_file} when `data` is a path (else {data}), and {eval_token_file,
    eval_every (default: the last step)} when `eval_data` is given; DataError, one line
    naming the option (`names`: what the caller calls data and eval_data), for text a model
    without a folder cannot tokenize, a bad corpus or one shorter than a sequence."""
    texts = [(name, value) for name, value in zip(names, (data, eval_data))
             if value is not None and value not in NAMED_SOURCES]
    if texts and not model.hf_folder:
        raise DataError(f"{texts[0][0]}: {texts[0][1]!r} is neither synthetic nor corpus, and a text corpus needs a "
                        f"problem whose model comes from a Hugging Face folder (model: {{hf: PATH}}), whose "
                        f"tokenizer.json tokenizes it")
    if eval_data in NAMED_SOURCES:
        raise DataError(f"{names[1]}: expected a text corpus (.jsonl, .txt or a folder), got {eval_data!r}")
    settings: dict = {"data": data}
    for name, value, key in ((names[0], data, "token_file"), (names[1], eval_data, "eval_token_file")):
        if value is not None and value not in NAMED_SOURCES:
            stream = prepare_stream(value, model.hf_folder, model.vocab, log)
            stream.check_length(seq_len, name)
            settings[key] = str(stream.path)
    if "token_file" in settings:
        settings["data"] = "text"
    if eval_data is not None:
        settings["eval_every"] = eval_every or steps
    return settings


def with_corpora(problem: Problem, model: str, steps: int, settings: dict) -> dict:
    """`run_plan`'s settings with `data=PATH` and `eval_data=PATH` tokenized as `--data` and
    `--eval-data` are (the others as given; data 'text' with its token_file is kept)."""
    data, eval_data = settings.get("data", "synthetic"), settings.get("eval_data")
    if data in (*NAMED_SOURCES, "text") and eval_data is None:
        return settings
    if model != "problem":
        raise DataError(f"data/eval_data: a text corpus is tokenized with the problem's model folder's tokenizer "
                        f"and trains that model: pass model='problem' (got model={model!r})")
    seq_len = settings.get("seq_len") or problem.training.seq_len
    made = corpus_settings(problem.model, "synthetic" if data == "text" else data, eval_data,
                           settings.get("eval_every", 0), steps, seq_len)
    if data == "text":
        made.pop("data")
    return {**{k: v for k, v in settings.items() if k != "eval_data"}, **made}
