"""Safe YAML loading that remembers where each key came from, so errors can name the line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from hpo.errors import ConfigIssue, SweepConfigError


class SweepLoader(yaml.SafeLoader):
    """SafeLoader that reads `1e-3` as a float, as YAML 1.2 and every sweep author do.

    PyYAML follows YAML 1.1, where a float needs a dot (`1.0e-3`), so `values: [1e-3, 3e-3]`
    would silently become strings: categorical learning rates that sort and compare as text.
    """


SweepLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


class YamlSource:
    """A parsed YAML document plus a map from dotted key paths to 1-based line numbers."""

    def __init__(self, data: Any, lines: dict[str, int], name: str):
        self.data = data
        self.lines = lines
        self.name = name

    @classmethod
    def from_text(cls, text: str, name: str = "<string>") -> "YamlSource":
        try:
            # A SafeLoader builds no Python objects from tags (no !!python/object).
            node = yaml.compose(text, Loader=SweepLoader)
            data = yaml.load(text, Loader=SweepLoader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark is not None else None
            problem = getattr(exc, "problem", None) or str(exc)
            raise SweepConfigError([ConfigIssue("", f"malformed YAML: {problem}", line)], name) from None
        lines: dict[str, int] = {}
        if node is not None:
            _index(node, "", lines)
        return cls(data, lines, name)

    @classmethod
    def from_file(cls, path: str | Path) -> "YamlSource":
        path = Path(path)
        if not path.is_file():
            raise SweepConfigError([ConfigIssue("", f"no such sweep file: {path}")], str(path))
        return cls.from_text(path.read_text(), str(path))

    def line_of(self, path: str) -> int | None:
        """The line of `path`, or of its nearest ancestor that the file spells out."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path.rpartition(".")[0]
        return self.lines.get("")


def _index(node: yaml.Node, prefix: str, lines: dict[str, int]) -> None:
    lines.setdefault(prefix, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            lines[path] = key_node.start_mark.line + 1
            _index(value_node, path, lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index(item, f"{prefix}.{i}", lines)
