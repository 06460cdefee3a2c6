"""The run settings of text corpora (docs/models-and-data.md §12), shared by `hexiscale run
--data PATH --eval-data PATH` and `hexiscale.run_plan(..., data=PATH, eval_data=PATH)`: each
corpus tokenized with the problem's model folder's tokenizer.json (once; the cache after
that) and checked to hold a sequence, before any process starts. An existing path is read
even where it is named like a named source (said in one line); `corpus` for a model of a
folder is the bundled text tokenized with its tokenizer. No torch."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from planner.problem import Problem
from planner.workload import ModelSpec
from runtime.model.text import DataError, prepare_stream

NAMED_SOURCES = ("synthetic", "corpus")  # token sources that are not files (runtime.model.data)
BUNDLED_TEXT = Path(__file__).parent / "data" / "corpus.txt"  # `corpus` (runtime.model.data.CORPUS_PATH)


def needs_tokenizer(value: str, folder_model: bool) -> bool:
    """Whether a run of a model from a folder (or not) tokenizes data `value`: any path; for a
    folder model also a path named like a named source, and `corpus`, whose bytes are no ids
    of its tokenizer."""
    if value not in NAMED_SOURCES:
        return True
    return folder_model and (value == "corpus" or Path(value).exists())


def text_of(name: str, value: str | None, folder_model: bool, log: Callable[[str], None]) -> str | None:
    """The text option `name` tokenizes (None: a named source read as it is, or nothing); a
    named source's name that is also a path here is said in one line, whichever is read."""
    if value is None or not needs_tokenizer(value, folder_model):
        if value in NAMED_SOURCES and Path(value).exists():
            log(f"note: {name} {value}: the named source; the path {value} here is not read "
                "(only a model from a Hugging Face folder reads text)")
        return None
    if value in NAMED_SOURCES and Path(value).exists():
        log(f"note: {name} {value}: reading the path {Path(value).resolve()} (it exists), not the named source")
        return value
    return str(BUNDLED_TEXT) if value == "corpus" else value


def corpus_settings(model: ModelSpec, data: str, eval_data: str | None, eval_every: int, steps: int, seq_len: int,
                    log: Callable[[str], None] | None = None, names: tuple[str, str] = ("data", "eval_data")) -> dict:
    """{data: 'text', token_file} when `data` is text (else {data}), and {eval_token_file,
    eval_every (default: the last step)} when `eval_data` is given; DataError, one line
    naming the option (`names`: what the caller calls data and eval_data), for text a model
    without a folder cannot tokenize, a bad corpus or one shorter than a sequence. `model` is
    the one trained: with a folder, `corpus` is the bundled text through its tokenizer."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    if eval_data in NAMED_SOURCES and not Path(eval_data).exists():  # held-out text is a path, always
        raise DataError(f"{names[1]}: expected a text corpus (.jsonl, .txt or a folder), got {eval_data!r}")
    texts = {"token_file": (names[0], text_of(names[0], data, bool(model.hf_folder), log)),
             "eval_token_file": (names[1], eval_data)}
    given = [(name, text) for name, text in texts.values() if text is not None]
    if given and not model.hf_folder:
        raise DataError(f"{given[0][0]}: {given[0][1]!r} is neither synthetic nor corpus, and a text corpus needs a "
                        f"problem whose model comes from a Hugging Face folder (model: {{hf: PATH}}), whose "
                        f"tokenizer.json tokenizes it")
    settings: dict = {"data": data}
    for key, (name, text) in texts.items():
        if text is not None:
            stream = prepare_stream(text, model.hf_folder, model.vocab, log)
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
    folder_model = model == "problem" and bool(problem.model.hf_folder)
    if eval_data is None and (data == "text" or not needs_tokenizer(data, folder_model)):
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
