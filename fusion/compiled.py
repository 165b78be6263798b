"""`torch.compile` for one object's method, with a compile cache of its own.

Dynamo keeps its compiled code, and counts recompilations against `recompile_limit`, per Python
code object. Every `FusedTrainer` shares the code of `forward_loss` and `FusedOptimizer._device_update`,
so one long-lived process that trains groups one after another (a reused actor, a repacked group
of another size, fp32 then bf16, a benchmark's rows) would pile each group's graphs onto one
cache, and with `fullgraph=True` the ninth group fails outright ("recompile limit exceeded").
Compiling a copy of the function's code gives each instance its own cache, freed with it.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import torch


def compile_method(method: types.MethodType, **options: Any) -> Callable[..., Any]:
    """`torch.compile(method, **options)` over a private copy of the method's code."""
    function = method.__func__
    own = types.FunctionType(
        function.__code__.replace(),  # a new code object: dynamo's cache lives on it
        function.__globals__,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )
    own.__kwdefaults__ = function.__kwdefaults__
    own.__qualname__ = function.__qualname__
    return torch.compile(types.MethodType(own, method.__self__), **options)
