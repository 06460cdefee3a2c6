"""The text of input files: YAML and JSON parsed strictly, and YAML written so that it reads back
the same (`planner.io` reads and writes the typed files on top of this).

Parsing refuses what the formats would silently resolve: a key written twice in one mapping
(the later value would replace the earlier one) and a key that is a list or a mapping (no field
is named so). YAML is read with YAML 1.2's numbers (`1e3` is a number, `010` is ten)."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml


class DuplicateKeyError(ValueError):
    """A mapping names one key twice: YAML and JSON would silently keep the last value."""

    def __init__(self, key: Any, lines: tuple[int, int] | None = None):
        self.key = str(key)
        where = f" (lines {lines[0]} and {lines[1]})" if lines else ""
        super().__init__(f"duplicate key{where}: the later value would silently replace the earlier one")


# libyaml's parser when PyYAML was built with it (about 3× faster on a 10^5-GPU cluster file);
# the construction, and so the duplicate-key check below, stays PyYAML's own Python code.
_SafeLoaderBase = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictYamlLoader(_SafeLoaderBase):
    """PyYAML's safe loader, refusing a key repeated inside one mapping."""

    def resolve(self, kind, value, implicit):
        """The tag of a node; a plain scalar's depends on its text alone (the safe loader has no
        path resolvers), so each distinct text is matched against the resolvers once."""
        if kind is yaml.ScalarNode and implicit[0]:
            seen = self.__dict__.setdefault("_plain_tags", {})
            tag = seen.get(value)
            if tag is None:
                tag = seen[value] = super().resolve(kind, value, implicit)
            return tag
        return super().resolve(kind, value, implicit)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self._refuse_repeated_keys(node, deep)
            self.flatten_mapping(node)  # merge keys (<<): the mapping's own keys override theirs
        return super().construct_mapping(node, deep=deep)

    def _refuse_repeated_keys(self, node, deep: bool) -> None:
        """A key written twice in one mapping (not one that overrides a merged `<<` key, which
        is what merging is for), or a key that is a list or mapping (unhashable)."""
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise NonScalarKeyError(line, "list" if isinstance(key_node, yaml.SequenceNode) else "mapping")
            if key_node.tag == "tag:yaml.org,2002:str":
                key = key_node.value  # a plain string key (nearly every key): no constructor call
            else:
                key = self.construct_object(key_node, deep=deep)
            if key in first_line:
                raise DuplicateKeyError(key, (first_line[key], line))
            first_line[key] = line

    def construct_yaml_int(self, node):
        """YAML 1.1 reads `010` as octal 8; nobody writing a batch of 010 means 8, so a
        leading zero is read as decimal, as YAML 1.2 does (0x and 0b keep their meaning)."""
        text = node.value.replace("_", "")
        digits = text.lstrip("+-")
        if len(digits) > 1 and digits[0] == "0" and digits.isdigit():
            return int(text, 10)
        return super().construct_yaml_int(node)


_StrictYamlLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                                  _StrictYamlLoader.construct_mapping)
_StrictYamlLoader.add_constructor("tag:yaml.org,2002:int", _StrictYamlLoader.construct_yaml_int)
# Numbers that YAML 1.1 reads as text and YAML 1.2 (and every JSON reader) as numbers: `1e3`
# and `1.5e-4` (1.1 wants a dot and a signed exponent), `09` (not octal, so 1.1 gives up).
# Numeric fields refuse text, so without these `count: 1e3` would be "not a number".
YAML_12_NUMBERS = (("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                     list("-+0123456789")),
                    ("tag:yaml.org,2002:int", re.compile(r"^[-+]?0[0-9_]+$"), list("-+0")))
for _tag, _regexp, _first in YAML_12_NUMBERS:
    _StrictYamlLoader.add_implicit_resolver(_tag, _regexp, _first)


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out


def parse_text(text: str, suffix: str) -> Any:
    """YAML or JSON (by file suffix), a repeated key being an error in either."""
    if suffix == ".json":
        return json.loads(text, object_pairs_hook=_json_pairs)
    return yaml.load(text, Loader=_StrictYamlLoader)  # noqa: S506 (a SafeLoader subclass)


class NonScalarKeyError(ValueError):
    """A mapping key that is a list or a mapping (`? [a, b]: 1`): no field is named so."""

    def __init__(self, line: int, kind: str):
        super().__init__(f"line {line}: a key is a {kind}; keys are names (text)")


# libyaml's emitter where PyYAML has it: the same text as the Python one (compared on 61 files),
# 3× faster (a 10^5-device cluster: 0.8 s against 2.6 s)
_SafeDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _Dumper(_SafeDumper):
    """Quotes the strings that _StrictYamlLoader reads as numbers (a machine named 09 or 1e3)."""


for _tag, _regexp, _first in YAML_12_NUMBERS:
    _Dumper.add_implicit_resolver(_tag, _regexp, _first)


def yaml_text(data: dict[str, Any]) -> str:
    """`data` as YAML that `parse_text` reads back equal (keys in their order)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)
