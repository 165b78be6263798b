"""The one error type that bad sweep input raises: every problem names its key path and line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from hpo.base.yaml_source import ConfigIssue, SweepConfigError

__all__ = ["ConfigIssue", "SweepConfigError", "checked_block"]

if TYPE_CHECKING:
    from pydantic import BaseModel

ModelT = TypeVar("ModelT", bound="BaseModel")


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
