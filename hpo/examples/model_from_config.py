"""An example's model built from a trial's config: one constructor argument per config key.

A sweep's values do not always arrive in the types a model's layers need: a `q_uniform` width is
a float, and `nn.Linear` refuses 64.0. The examples' constructors already name each knob and its
type, so the config is read by their signatures rather than by one hand-written conversion per
knob that has to be kept in step with the constructor.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from torch import nn

Model = TypeVar("Model", bound=nn.Module)


def build_from_config(model: type[Model], config: Mapping[str, Any], **given: Any) -> Model:
    """`model` with every constructor argument not in `given` taken from `config` and converted to
    its annotated type (an optional one, `float | None`, keeps None). `config` is resolved (the
    workload's defaults filled in), so a key it lacks is a KeyError, not the constructor's default."""
    hints = typing.get_type_hints(model.__init__)
    arguments = dict(given)
    for name in inspect.signature(model).parameters:
        if name not in given:
            arguments[name] = _convert(config[name], hints[name])
    return model(**arguments)


def _convert(value: Any, annotation: Any) -> Any:
    if isinstance(annotation, types.UnionType):  # `T | None`: None stays None, anything else becomes a T
        if value is None:
            return None
        (annotation,) = [member for member in typing.get_args(annotation) if member is not type(None)]
    return annotation(value)
