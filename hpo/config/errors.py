"""The one error type that bad sweep input raises: every problem names its key path and line."""

from __future__ import annotations

from dataclasses import dataclass


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
