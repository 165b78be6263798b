"""A YAML file read once into its data and the line of every key: sweep files and pipeline job files.

`YamlSource` parses the text into YAML nodes and, before anything walks or validates them, checks
them for what PyYAML accepts silently but a configuration must not: a key given twice (the last
one would win unseen), aliases that expand past a small bound (a "billion laughs" file would
otherwise make every later walk of the data exponential) or refer to themselves, `[` and `{`
nested so deep that PyYAML's scanner takes minutes, and text that is not UTF-8. `1e-3` reads as
a float, as YAML 1.2 and every author expect. Each problem is a `ConfigIssue` with its key path
and line, raised as a `SweepConfigError`.

`hpo.config` (the sweep files, `hpo.config.errors` re-exports the error types) and
`pipeline_bubble.profile_cli` (the job files of `hpo profile pipeline`) read their files here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class ConfigIssue:
    path: str  # dotted key path, e.g. "parameters.lr.max"; "" for the whole file
    message: str
    line: int | None = None  # 1-based line in the YAML file, when known

    def format(self, source: str | None = None) -> str:
        where = source or "<config>"
        if self.line is not None:
            where += f":{self.line}"
        return f"{where}: {self.path or '(top level)'}: {self.message}" if self.path else f"{where}: {self.message}"


class SweepConfigError(ValueError):
    """A sweep config that cannot run. `issues` lists every problem found, not just the first."""

    def __init__(self, issues: list[ConfigIssue], source: str | None = None):
        self.issues = issues
        self.source = source
        super().__init__("\n".join(issue.format(source) for issue in issues))


#: Values (scalars, lists and mappings) a sweep file may expand to once aliases are followed.
#: Real sweeps have a few hundred; the bound only stops alias bombs.
MAX_EXPANDED_NODES = 10_000
#: Nesting of `[...]` / `{...}`. PyYAML's scanner takes time quadratic in this depth (a file of
#: 20,000 `[` scans for minutes), so deeper files are refused before PyYAML sees them.
MAX_FLOW_DEPTH = 64
#: Sweep files are a few kilobytes; a bound on the size bounds every other walk of the file.
MAX_FILE_BYTES = 1024 * 1024


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
        # A SafeLoader builds no Python objects from tags (no !!python/object).
        too_deep = _line_past_flow_depth(text, MAX_FLOW_DEPTH)
        if too_deep is not None:
            message = f"malformed YAML: [ ] and {{ }} nest more than {MAX_FLOW_DEPTH} levels deep"
            raise SweepConfigError([ConfigIssue("", message, too_deep)], name)
        loader = None
        try:
            loader = SweepLoader(text)  # the reader refuses control characters here, before parsing
            node = loader.get_single_node()
            lines: dict[str, int] = {}
            if node is not None:
                _check_expansion(node, name)
                # before construction, which moves the keys a merge (`<<: *base`) brings into the
                # mapping itself, where a key written to override one would read as given twice
                duplicates: list[ConfigIssue] = []
                _index(node, "", lines, duplicates)
                if duplicates:
                    raise SweepConfigError(duplicates, name)
            data = loader.construct_document(node) if node is not None else None
        except yaml.reader.ReaderError as exc:
            line = text[: exc.position].count("\n") + 1
            message = f"malformed YAML: character U+{exc.character:04X} is not allowed in a YAML file ({exc.reason})"
            raise SweepConfigError([ConfigIssue("", message, line)], name) from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark is not None else None
            problem = getattr(exc, "problem", None) or str(exc)
            raise SweepConfigError([ConfigIssue("", f"malformed YAML: {problem}", line)], name) from None
        except RecursionError:
            raise SweepConfigError([ConfigIssue("", "malformed YAML: nested too deeply", None)], name) from None
        finally:
            if loader is not None:
                loader.dispose()
        return cls(data, lines, name)

    @classmethod
    def from_file(cls, path: str | Path, kind: str = "sweep file") -> "YamlSource":
        """`kind` names the file in the messages ("sweep file", "job file")."""
        path = Path(path)
        if not path.is_file():
            raise SweepConfigError([ConfigIssue("", f"no such {kind}: {path}")], str(path))
        if path.stat().st_size > MAX_FILE_BYTES:
            message = f"a {kind} is at most {MAX_FILE_BYTES // 1024} KiB; this one is {path.stat().st_size // 1024} KiB"
            raise SweepConfigError([ConfigIssue("", message)], str(path))
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
            message = f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at column {column}; save the file as UTF-8"
            raise SweepConfigError([ConfigIssue("", message, line)], str(path)) from None
        return cls.from_text(text, str(path))

    def line_of(self, path: str) -> int | None:
        """The line of `path`, or of its nearest ancestor that the file spells out."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path.rpartition(".")[0]
        return self.lines.get("")


def _line_past_flow_depth(text: str, limit: int) -> int | None:
    """The line where flow collections first nest deeper than `limit`, or None.

    Brackets inside quoted strings and comments do not count; a bracket inside a plain scalar
    (`a[0]`) may, which only matters to a file that already nests near the limit.
    """
    depth, line, quote, comment = 0, 1, "", False
    previous = "\n"
    escaped = False
    for char in text:
        if char == "\n":  # ends a comment; a quoted scalar may go on over lines
            line, comment = line + 1, False
        elif comment:
            pass
        elif quote == '"':
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quote = ""
        elif quote == "'":
            if char == "'":
                quote = ""
        elif char in "\"'" and previous in " \t\n[{,:-?":
            quote = char
        elif char == "#" and previous in " \t\n":
            comment = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return line
        elif char in "]}":
            depth = max(0, depth - 1)
        previous = char
    return None


def _check_expansion(root: yaml.Node, name: str) -> None:
    """Refuse self-referencing aliases and documents that expand past `MAX_EXPANDED_NODES`.

    Sizes are memoised per node, so the check itself is linear in the file, however deep the
    aliases nest.
    """
    sizes: dict[int, int] = {}
    in_progress: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in in_progress:
            issue = ConfigIssue("", "malformed YAML: an alias refers to the value that contains it", node.start_mark.line + 1)
            raise SweepConfigError([issue], name)
        in_progress.add(key)
        if isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(item) for item in node.value)
        else:
            total = 1
        in_progress.discard(key)
        if total > MAX_EXPANDED_NODES:
            message = (
                f"malformed YAML: aliases expand this file to more than {MAX_EXPANDED_NODES} values; "
                "write the values out or use fewer nested aliases"
            )
            raise SweepConfigError([ConfigIssue("", message, node.start_mark.line + 1)], name)
        sizes[key] = total
        return total

    size(root)


def _index(node: yaml.Node, prefix: str, lines: dict[str, int], duplicates: list[ConfigIssue]) -> None:
    lines.setdefault(prefix, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            path = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            if key_node.tag == "tag:yaml.org,2002:merge":
                # `<<: *base` (or a list of them): the merged keys are this mapping's, at the lines
                # they were written; a key written beside the merge overrides one and keeps its own
                merged: dict[str, int] = {}
                for source in value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]:
                    _index(source, prefix, merged, [])  # its own duplicates are reported where it is written
                for merged_path, merged_line in merged.items():
                    lines.setdefault(merged_path, merged_line)
                continue
            if isinstance(key_node, yaml.ScalarNode):
                if key_node.value in seen:
                    message = f"duplicate key {key_node.value!r}: first given on line {seen[key_node.value]}, again on line {line}"
                    duplicates.append(ConfigIssue(path, message, line))
                    continue
                seen[key_node.value] = line
            lines[path] = line
            _index(value_node, path, lines, duplicates)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index(item, f"{prefix}.{i}", lines, duplicates)
