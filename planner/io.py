"""Reading and writing problem, cluster, model and plan files (YAML or JSON).

Every failure is an `InputError` naming the file, the field and the reason, so that the CLI
prints one line instead of a traceback. A problem file refers to its cluster and model
either inline, by a path relative to itself, or by the name of a bundled instance.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from planner.base import FROM_FILE, MAX_NAME, Name, write_atomically
from planner.file_text import DuplicateKeyError, NonScalarKeyError, parse_text, yaml_text
from planner.hardware import Cluster
from planner.hf_config import HFConfigError, read_hf_model
from planner.kinds import PLAN_KINDS, kind_of_format
from planner.problem import Problem
from planner.workload import ModelSpec, TrainingSpec

T = TypeVar("T", bound=BaseModel)
KINDS = ("clusters", "models", "problems", "plans")
PROBLEM_FIELDS = ("name", "cluster", "model", "training", "objective", "budget_per_hour")


class InputError(ValueError):
    """A malformed input file: which file, which field, why."""

    def __init__(self, file: str | Path, field: str, reason: str):
        self.file, self.field, self.reason = str(file), field, reason
        super().__init__(f"{self.file}: {field}: {reason}" if field else f"{self.file}: {reason}")


def bundled_dir(kind: str) -> Path:
    """Folder of the bundled instances of one kind (clusters, models, problems, plans)."""
    return Path(str(resources.files("instances").joinpath(kind)))


def bundled_names(kind: str) -> list[str]:
    folder = bundled_dir(kind)
    return sorted(p.stem for p in folder.glob("*.yaml")) + sorted(p.stem for p in folder.glob("*.json"))


def read_mapping(path: Path) -> dict[str, Any]:
    """Parse a YAML or JSON file whose top level must be a mapping."""
    if path.exists() and not path.is_file():  # a FIFO would block the read until a writer came
        raise InputError(path, "", "is a directory, not a file" if path.is_dir() else
                         "not a regular file (a pipe, socket or device): expected a YAML or JSON file")
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: a byte-order mark is dropped (YAML drops it too)
    except UnicodeDecodeError as exc:
        raise InputError(path, "", f"not a text file (byte {exc.start} is not UTF-8): expected YAML or JSON") from None
    except OSError as exc:
        raise InputError(path, "", f"cannot read file ({exc.strerror})") from None
    if not text.strip():
        raise InputError(path, "", "the file is empty: expected a YAML or JSON mapping")
    try:
        data = parse_text(text, path.suffix)
    except DuplicateKeyError as exc:
        raise InputError(path, exc.key, str(exc)) from None
    except NonScalarKeyError as exc:
        raise InputError(path, "", str(exc)) from None
    except json.JSONDecodeError as exc:
        raise InputError(path, "", f"JSON syntax error at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(path, "", f"YAML syntax error{where}: {problem}") from None
    if data is None:  # only comments, or a bare `null`
        raise InputError(path, "", "the file holds no data: expected a YAML or JSON mapping")
    if not isinstance(data, dict):
        raise InputError(path, "", f"expected a mapping at the top level, got {type(data).__name__}")
    return data


def build(cls: type[T], data: Any, file: str | Path, prefix: str = "", context: dict | None = FROM_FILE) -> T:
    """Validate `data` as `cls`; turn pydantic's errors into one InputError (`context`: None for
    objects made in Python, whose derived names may pass MAX_NAME)."""
    try:
        return cls.model_validate(data, context=context)  # from a file: names at most MAX_NAME long
    except ValidationError as exc:
        errors = _distinct_errors(exc.errors())
        first = errors[0]
        more = "".join(f"; {_error_field(e, prefix) or 'file'}: {_error_reason(e)}" for e in errors[1:])
        # model-level checks (no loc) already name their fields in the reason
        raise InputError(file, _error_field(first, prefix), _error_reason(first) + more) from None


def _distinct_errors(errors: list[dict]) -> list[dict]:
    """Every error once: a non-empty tuple whose only item failed also reports itself empty,
    which is the item's error again, not a new one."""
    out = []
    for e in errors:
        loc = tuple(e["loc"])
        if not any(tuple(o["loc"])[: len(loc)] == loc and o is not e for o in out):
            out.append(e)
    return out


def _error_field(error: dict, prefix: str) -> str:
    return ".".join(str(x) for x in (prefix, *error["loc"]) if x != "")


def _error_reason(error: dict) -> str:
    reason = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        reason = "unknown field (a typo?)"
    if "input" in error and error["type"] != "missing" and not isinstance(error["input"], (dict, list)):
        reason += f" (got {_shown(error['input'])})"
    return reason


def _shown(value: Any, limit: int = 60) -> str:
    """repr(value), cut short: a 10^5-character name would otherwise fill the one-line message."""
    text = repr(value)
    if len(text) <= limit:
        return text
    length = f"{len(value):,} characters" if isinstance(value, str) else f"{len(text):,} characters written"
    return f"{text[:limit]}… ({length})"  # a string's own length, not its repr's with the quotes


def _resolve(ref: Any, kind: str, base: Path, file: Path, field: str) -> tuple[dict[str, Any], Path]:
    """A cluster/model reference: inline mapping, relative path, or bundled name."""
    if isinstance(ref, dict):
        return ref, file
    if not isinstance(ref, str) or not ref.strip():
        raise InputError(file, field, f"expected a mapping, a file path or a bundled {kind[:-1]} name, got {ref!r}")
    for candidate in (base / ref, base / f"{ref}.yaml", bundled_dir(kind) / f"{ref}.yaml"):
        if candidate.is_file():
            return read_mapping(candidate), candidate
    if (base / ref).is_dir():
        raise InputError(file, field, f"{ref!r} is a folder ({base / ref}), expected a {kind[:-1]} file")
    if (base / ref).exists():  # a pipe or a device: read_mapping says which
        return read_mapping(base / ref), base / ref
    raise InputError(file, field, f"no file {ref!r} in {base.resolve()} and no bundled {kind[:-1]} so named "
                                  f"(bundled: {', '.join(bundled_names(kind))})")


def _find(path: str | Path, kind: str) -> Path:
    """A path as given, or the name of a bundled instance of that kind."""
    p = Path(path)
    if p.is_file():
        return p
    for candidate in (bundled_dir(kind) / f"{path}.yaml", bundled_dir(kind) / f"{path}.json"):
        if candidate.is_file():
            return candidate
    if p.exists():  # a folder or a pipe: read_mapping says which, rather than "no such file"
        return p
    raise InputError(p, "", "no such file" + (f" or bundled {kind[:-1]}" if "/" not in str(path) else ""))


def _named(data: dict[str, Any], default: str) -> dict[str, Any]:
    """A file without a `name` is named after its file (or, inline, after its problem), so
    that messages never read "model model" or "cluster cluster"."""
    return data if "name" in data or not isinstance(data, dict) else {"name": default, **data}


def load_cluster(path: str | Path) -> Cluster:
    path = _find(path, "clusters")
    return build(Cluster, _named(read_mapping(path), path.stem), path)


HF_PREFIX = "hf:"


def hf_model(path: str | Path, seq_len: int | None = None, file: str | Path | None = None) -> ModelSpec:
    """The ModelSpec of a Hugging Face folder or config.json (docs/models-and-data.md §12); `file`: the
    problem file naming it, for the message when the folder is missing."""
    if file is not None and not Path(path).exists():
        raise InputError(file, "model.hf", f"no Hugging Face model folder or config.json at {str(path)!r}")
    try:
        return read_hf_model(path, seq_len)
    except HFConfigError as exc:
        raise InputError(exc.file, exc.field, exc.reason) from None


def load_model(path: str | Path) -> ModelSpec:
    """A model file, a bundled model's name, or `hf:PATH` (a Hugging Face folder)."""
    if str(path).startswith(HF_PREFIX):
        return hf_model(str(path)[len(HF_PREFIX):])
    path = _find(path, "models")
    return build(ModelSpec, _named(read_mapping(path), path.stem), path)


def _hf_reference(ref: Any, base: Path, file: Path) -> Path | None:
    """The folder of `model: {hf: path}` (relative to the problem file), None for other forms."""
    if not (isinstance(ref, dict) and "hf" in ref):
        return None
    if set(ref) != {"hf"} or not isinstance(ref["hf"], str):
        raise InputError(file, "model", "expected {hf: PATH} alone (a Hugging Face folder or its config.json)")
    return base / ref["hf"]


def load_problem(path: str | Path) -> Problem:
    """Read a problem file; its cluster and model may be inline, paths or bundled names."""
    path = _find(path, "problems")
    data = read_mapping(path)
    other = _other_kind(data)
    if other and not {"cluster", "model", "training"} & set(data):
        raise InputError(path, "", f"{other}, not a problem file (a problem has cluster, model and training)")
    unknown = sorted(set(data) - set(PROBLEM_FIELDS))  # first: `trainig:` is a typo, not a missing training
    if unknown:
        raise InputError(path, unknown[0], f"unknown field, a typo? (expected {', '.join(PROBLEM_FIELDS)})")
    missing = [k for k in ("cluster", "model", "training") if k not in data]
    if missing:
        raise InputError(path, missing[0], "field required")
    cluster_data, cluster_file = _resolve(data["cluster"], "clusters", path.parent, path, "cluster")
    name = _problem_name(data, path)
    inline = "cluster" if cluster_file == path else ""
    cluster_name = _suffixed(name, "-cluster") if inline else cluster_file.stem
    cluster = build(Cluster, _named(cluster_data, cluster_name), cluster_file, inline)
    training = build(TrainingSpec, data["training"], path, "training")
    model = _problem_model(data["model"], path, name, training)
    # the objective and the budget are checked against the cluster's prices here (§13)
    goal = {k: data[k] for k in ("objective", "budget_per_hour") if k in data}
    return build(Problem, {"name": name, "cluster": cluster, "model": model, "training": training, **goal}, path)


def _other_kind(data: dict[str, Any]) -> str:
    """What a file given where a problem is expected holds instead, by its fields ("" when it
    looks like none): a cluster, a model, a plan, or training settings alone."""
    keys = set(data) - {"name"}
    if kind_of_format(data.get("format")) is not None:
        return f"this is a plan file ({data['format']})"
    for what, fields in (("a cluster", set(Cluster.model_fields)), ("a model", set(ModelSpec.model_fields)),
                         ("training settings", set(TrainingSpec.model_fields))):
        if keys and keys <= fields:
            return f"this file holds {what}"
    return ""


_NAME = TypeAdapter(Name)


def _problem_name(data: dict[str, Any], path: Path) -> str:
    """The problem's name (its file's stem by default), checked before the inline cluster and
    model are named after it: `str()` once made `name:` (null) the name "None"."""
    try:
        return _NAME.validate_python(data.get("name", path.stem), context=FROM_FILE)
    except ValidationError as exc:
        raise InputError(path, "name", _error_reason(exc.errors()[0])) from None


def _suffixed(name: str, suffix: str) -> str:
    """name + suffix, the name cut so that the whole stays a valid name (MAX_NAME)."""
    return name[: MAX_NAME - len(suffix)] + suffix


def _problem_model(ref: Any, path: Path, name: str, training: TrainingSpec) -> ModelSpec:
    """A problem's model: {hf: folder}, inline, a path relative to the problem or a bundled name."""
    folder = _hf_reference(ref, path.parent, path)
    if folder is not None:
        return hf_model(folder, training.seq_len, file=path)
    model_data, model_file = _resolve(ref, "models", path.parent, path, "model")
    model_name = _suffixed(name, "-model") if model_file == path else model_file.stem
    return build(ModelSpec, _named(model_data, model_name), model_file, "model" if model_file == path else "")


def problem_schema() -> dict[str, Any]:
    """The JSON Schema of a problem file as load_problem reads it: besides an inline mapping,
    `cluster` and `model` may be a bundled name or a path, and `model` {hf: FOLDER}. (Problem's
    own schema, for the validated type, has only the mappings.)"""
    schema = Problem.model_json_schema()
    props = schema["properties"]
    named = "a bundled {0}'s name, or the path of a {0} file relative to the problem file"
    props["cluster"] = {"anyOf": [props["cluster"], {"type": "string", "description": named.format("cluster")}]}
    hf = {"type": "object", "additionalProperties": False, "required": ["hf"],
          "properties": {"hf": {"type": "string", "description": "a Hugging Face model folder or its config.json, "
                                                                "relative to the problem file"}}}
    props["model"] = {"anyOf": [props["model"], {"type": "string", "description": named.format("model")}, hf]}
    return schema


def load_plan(path: str | Path):
    """A plan file of any kind, typed by its `format` tag (layered: hexiscale.plan/1)."""
    path = _find(path, "plans")
    data = read_mapping(path)
    kind = kind_of_format(data.get("format"))
    if kind is None:
        known = ", ".join(repr(k.format) for k in PLAN_KINDS.values())
        raise InputError(path, "format", f"expected one of {known}, got {data.get('format')!r}")
    return build(kind.plan_type, data, path)


def save_plan(plan, path: str | Path) -> None:
    write_atomically(path, plan.to_json() + "\n")


def problem_to_dict(problem: Problem) -> dict[str, Any]:
    """A self-contained problem mapping (cluster and model inline; a model read from a Hugging
    Face folder as {hf: folder}, which it is read from again), for writing files."""
    data = problem.model_dump(mode="json", exclude_defaults=True)
    if problem.model.hf_folder:
        data["model"] = {"hf": problem.model.hf_folder}
    return data


def save_yaml(data: dict[str, Any], path: str | Path) -> None:
    write_atomically(path, yaml_text(data))
