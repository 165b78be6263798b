"""The one error type that bad sweep input raises: every problem names its key path and line."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from pydantic import BaseModel

ModelT = TypeVar("ModelT", bound="BaseModel")


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


def checked_block(model: type[ModelT], block: Mapping[str, Any], key: str) -> ModelT:
    """A Python API argument that a sweep file writes as its `key:` block (`hpo.run(logging=...,
    checkpoint=...)`), checked as that block is: a mistyped key or a bad value fails in one line
    naming `key.<field>` before Ray starts, not as pydantic's multi-line report."""
    from pydantic import ValidationError

    try:
        return model.model_validate(dict(block))
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join([key, *map(str, error["loc"])])
        raise ValueError(f"{where}: {error['msg'].removeprefix('Value error, ')}") from None
