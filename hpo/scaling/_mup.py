"""The muP proxy (and target) of a workload, built with Microsoft's `mup` package.

`MuPWorkload` wraps a user's `Workload` and builds its model at one width in muP, relative to
a base width (by default the target's, so the target itself is ordinary parametrisation):

1. the user's model factory builds the model at the requested width;
2. the output layer (`readout`) becomes a `mup.MuReadout` (same weights, so at the base width
   the model is bit-identical to the user's), or a `mup.MuSharedReadout` when its weight is tied
   to another layer's (an embedding's), which keeps the tie and the embedding's init;
3. `mup.set_base_shapes(model, base, delta=delta)`, with base and delta models built on the
   meta device (shapes only, no memory even for a huge target), marks which dimensions are
   "width" and rescales the default PyTorch init to muP;
4. if the config sets `init_std`, every Linear/Embedding weight is re-drawn with
   `mup.init.normal_(std=init_std)` (muP-scaled) and biases zeroed: GPT-2's init under muP;
   `readout_zero_init: true` zeroes the readout (logits start at 0 at every width);
5. `lr_multipliers` returns the per-parameter factors that `mup.MuAdam`/`MuAdamW`/`MuSGD` apply,
   so the plain trainer and the fused optimizers both train the proxy in muP.

With a depth (`scaling.target_depth`), the same wrapper also builds the model at the proxy's
number of residual blocks (the workload's `depth_key`), passes the residual-branch multiplier
`residual_mult` x (L/L_base)**-alpha to the factory, and multiplies the learning rate and Adam eps
of the parameters inside the blocks by CompleteP's depth factors (`hpo.scaling._depth`).

Example::

    from examples.char_gpt import workload
    from hpo.scaling import ScalingConfig, proxy_workload
    proxy = proxy_workload(workload, ScalingConfig(target_width=256, ratio=4))
    model = proxy.build_model(proxy.resolve({"lr": 2**-7}))   # width 64, muP relative to 256
    deep = proxy_workload(workload, ScalingConfig(target_width=256, ratio=4, target_depth=8, proxy_depth=2))
    model = deep.build_model(deep.resolve({}))   # 2 blocks; the depth-8 target's branches get x 2/8
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import mup
import torch
from torch import nn

from hpo.base.workload import RESIDUAL_MULT, Batch, Workload
from hpo.scaling._depth import (
    ADAM_OPTIMIZERS,
    depth_contract_problem,
    depth_settings,
    hidden_eps_factor,
    hidden_lr_factor,
    hidden_parameters,
    residual_multiplier,
)

if TYPE_CHECKING:
    from hpo.scaling._config import ScalingConfig


class ScalingError(ValueError):
    """A model that muP scaling cannot handle; the message names the layer and the fix."""


class MuPWorkload(Workload):
    """`workload` built at `width` in muP with base width `base_width`, and at `depth` residual
    blocks scaled relative to `base_depth` (CompleteP for `depth_alpha` 1, Depth-muP for 0.5; see
    `hpo.scaling._depth`); everything else delegated. `width=None` leaves the width alone (a
    depth-only proxy), `depth=None` the depth (a width-only proxy, exactly as before depth scaling).

    Picklable (Ray ships it to workers): it holds only the user's workload and a few numbers.
    """

    def __init__(
        self,
        workload: Workload,
        width: int | None,
        base_width: int | None = None,
        readout: str = "readout",
        *,
        depth: int | None = None,
        base_depth: int | None = None,
        depth_alpha: float = 1.0,
    ):
        if isinstance(workload, MuPWorkload):
            raise ScalingError("workload is already muP-scaled; wrap the user's workload, not a proxy")
        if width is None and depth is None:
            raise ScalingError("MuPWorkload needs a width, a depth or both to scale")
        if width is not None and base_width is None:
            raise ScalingError("muP needs base_width (the width where muP equals the user's model) with width")
        if depth is not None and (problem := depth_contract_problem(workload)):
            raise ScalingError(problem)
        self.inner = workload
        self.width = None if width is None else int(width)
        self.base_width = None if base_width is None else int(base_width)
        self.readout = readout
        self.depth = None if depth is None else int(depth)
        self.base_depth = self.depth if base_depth is None else int(base_depth)
        self.depth_alpha = float(depth_alpha)
        self.name = workload.name + (f"_mup{self.width}" if self.width is not None else "")
        self.name += f"_depth{self.depth}" if self.depth is not None else ""
        self.metric = workload.metric
        self.mode = workload.mode
        self.defaults = {**workload.defaults, **self._sizes()}
        self.steps_per_iteration = workload.steps_per_iteration
        if hasattr(workload, "eval_metric_names"):
            self.eval_metric_names = workload.eval_metric_names
        self.depth_key, self.residual_blocks = workload.depth_key, workload.residual_blocks

    def __repr__(self) -> str:
        depth = "" if self.depth is None else f", depth={self.depth}, base_depth={self.base_depth}, depth_alpha={self.depth_alpha:g}"
        return (
            f"MuPWorkload({self.inner.name!r}, width={self.width}, base_width={self.base_width}, "
            f"readout={self.readout!r}{depth})"
        )

    def _sizes(self) -> dict[str, int]:
        """The config keys this workload forces: `width` and the depth key, where scaled."""
        sizes = {} if self.width is None else {"width": self.width}
        if self.depth is not None:
            sizes[self.inner.depth_key] = self.depth
        return sizes

    # -- the model ---------------------------------------------------------------------------

    def resolve(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The user's resolution, with `width` (and the depth key) forced to this workload's."""
        return {**self.inner.resolve(config), **self._sizes()}

    def build_model(self, config: Mapping[str, Any]) -> nn.Module:
        config = self._model_config(config)
        model = self.inner.build_model(config)
        if self.width is None:
            return model
        _swap_readout(model, self.readout, self.inner.name)
        base, delta = self._shape_models(config)
        try:
            mup.set_base_shapes(model, base, delta=delta, rescale_params=False)
        except AssertionError as error:  # mup's check for width->finite Linear layers
            raise ScalingError(
                f"muP cannot scale workload {self.inner.name!r}: {error} Only the output layer may map width "
                f"to a fixed size; if that layer is the model's output, set `scaling.readout` to its name "
                f"(now {self.readout!r})."
            ) from None
        _rescale_to_mup(model)
        init_std = config.get("init_std")
        if init_std is not None:
            mup_normal_init_(model, float(init_std))
        if config.get("readout_zero_init"):
            readout = model.get_submodule(self.readout)
            if isinstance(readout, mup.MuSharedReadout):
                shared = next(name for name, p in model.named_parameters() if p is readout.weight)
                raise ScalingError(
                    f"readout_zero_init: the readout {self.readout!r} of workload {self.inner.name!r} shares its weight "
                    f"with {shared!r}; zeroing it would zero that embedding too, and the model could not learn. "
                    "Drop readout_zero_init or untie the output layer."
                )
            with torch.no_grad():
                for tensor in readout.parameters():
                    tensor.zero_()
        return model

    def _model_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """What the user's factory gets: the sizes, and with depth scaling the residual-branch
        multiplier `residual_mult` (the config's own value, a transferable multiplier) x (L/L_base)**-alpha."""
        config = {**config, **self._sizes()}
        if self.depth is not None:
            factor = residual_multiplier(self.depth, self.base_depth, self.depth_alpha)
            config[RESIDUAL_MULT] = float(config.get(RESIDUAL_MULT, 1.0)) * factor
        return config

    def _shape_models(self, config: Mapping[str, Any]) -> tuple[nn.Module, nn.Module]:
        """Models at the base width and at twice it, on the meta device (shapes only)."""
        base = _build_shapes_only(self.inner, {**config, "width": self.base_width})
        delta = _build_shapes_only(self.inner, {**config, "width": 2 * self.base_width})
        base_shapes = {name: p.shape for name, p in base.named_parameters()}
        if all(base_shapes[name] == p.shape for name, p in delta.named_parameters()):
            raise ScalingError(
                f"workload {self.inner.name!r} builds the same parameter shapes at width {self.base_width} and "
                f"{2 * self.base_width}: its build_model must size the model by config['width']"
            )
        return base, delta

    def validate(self, config: Mapping[str, Any] | None = None) -> nn.Module:
        """Build the model once, raising `ScalingError` or warning about attention (width) and an
        unread residual multiplier (depth); returns the model."""
        config = self.resolve(config or {})
        model = self.build_model(config)
        if self.width is not None:
            for message in self.attention_problems(config):
                warnings.warn(message, UserWarning, stacklevel=2)
        if self.depth is not None:
            self.check_depth_contract(config)
        return model

    def attention_problems(self, config: Mapping[str, Any]) -> list[str]:
        """`attention_scale_problems` of the model at the base width and twice it (shapes only):
        attention that muP's 1/head_dim rule would not transfer, which a few steps of training at
        small widths may not show."""
        base, delta = self._shape_models(self._model_config(self.resolve(config)))
        return attention_scale_problems(base, delta)

    def check_depth_contract(self, config: Mapping[str, Any]) -> None:
        """The depth key must add blocks under `residual_blocks` (else `ScalingError`), and the factory
        should read `residual_mult` (else a warning): what a sweep and the depth coordinate check refuse."""
        key, blocks = self.inner.depth_key, self.inner.residual_blocks
        counts = {}
        for depth in (self.depth, self.depth + 1):
            model = _build_shapes_only(self.inner, {**self._model_config(config), key: depth})
            counts[depth] = len(hidden_parameters(model, blocks))
        if counts[self.depth] == 0 or counts[self.depth + 1] <= counts[self.depth]:
            raise ScalingError(
                f"depth scaling: workload {self.inner.name!r} has {counts[self.depth]} parameters under "
                f"{blocks!r} at {key}={self.depth} and {counts[self.depth + 1]} at {key}={self.depth + 1}; its "
                f"build_model must build config[{key!r}] residual blocks under the module `residual_blocks` "
                f"(now {blocks!r})"
            )
        if not _reads_residual_mult(self.inner, self._model_config(config), blocks):
            warnings.warn(
                f"depth scaling: the residual blocks of workload {self.inner.name!r} compute the same with "
                f"{RESIDUAL_MULT}=1 and 2; multiply every residual branch by config[{RESIDUAL_MULT!r}] "
                "(x = x + residual_mult * branch(x)), or the proxy's optimum will not transfer across depth",
                UserWarning,
                stacklevel=3,
            )

    # -- optimizer factors (muP's, as mup.MuAdam / MuAdamW / MuSGD set them, times depth's) ----

    def lr_multipliers(self, model: nn.Module, optimizer: str) -> dict[str, float]:
        factors = {} if self.width is None else {name: lr for name, (lr, _) in mup_factors(model, optimizer).items()}
        if self.depth is not None:
            depth_factor = hidden_lr_factor(self.depth, self.base_depth, self.depth_alpha, optimizer)
            for name in self._hidden(model):
                factors[name] = factors.get(name, 1.0) * depth_factor
        return factors

    def weight_decay_multipliers(self, model: nn.Module, optimizer: str) -> dict[str, float]:
        """mup also scales weight decay per parameter (the inverse of the lr factor); see `mup_factors`.
        Depth leaves weight decay alone (`hpo.scaling._depth`)."""
        if self.width is None:
            return {}
        return {name: wd for name, (_, wd) in mup_factors(model, optimizer).items()}

    def eps_multipliers(self, model: nn.Module, optimizer: str) -> dict[str, float]:
        """CompleteP's hidden Adam eps x (L/L_base)**-alpha; nothing for SGD or a width-only proxy."""
        if self.depth is None or optimizer not in ADAM_OPTIMIZERS:
            return {}
        factor = hidden_eps_factor(self.depth, self.base_depth, self.depth_alpha)
        return dict.fromkeys(self._hidden(model), factor)

    def _hidden(self, model: nn.Module) -> list[str]:
        names = hidden_parameters(model, self.inner.residual_blocks)
        if not names:
            raise ScalingError(
                f"depth scaling: the model of workload {self.inner.name!r} has no parameters under "
                f"{self.inner.residual_blocks!r}; set the workload's `residual_blocks` to the module that holds "
                "its residual blocks"
            )
        return names

    # -- delegated ------------------------------------------------------------------------------

    def train_batches(self, config: Mapping[str, Any], seed: int) -> Iterator[Batch]:
        return self.inner.train_batches(config, seed)

    def eval_batches(self, config: Mapping[str, Any]) -> list[Batch]:
        return self.inner.eval_batches(config)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.inner.loss(output, target)

    def batch_metrics(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.inner.batch_metrics(output, target)


def proxy_workload(
    workload: Workload, scaling: "ScalingConfig", *, config: Mapping[str, Any] | None = None, validate: bool = True
) -> MuPWorkload:
    """The proxy of `workload`: `scaling.proxy` width in muP with base `scaling.base`, and
    `scaling.depth_proxy` blocks depth-scaled relative to `scaling.depth_base` (each where scaled).

    With `validate`, builds the proxy once now (from `config`, e.g. the sweep's constant keys, over
    the workload's defaults) so that a model muP cannot handle fails here, with the layer and the
    fix, not inside a Ray worker; attention scaling problems are warned about.
    """
    proxy = MuPWorkload(workload, scaling.proxy, scaling.base, scaling.readout, **depth_settings(scaling, target=False))
    if validate:
        proxy.validate(config)
    return proxy


def target_workload(workload: Workload, scaling: "ScalingConfig") -> MuPWorkload:
    """The target at `scaling.target_width` and `scaling.target_depth`. At the default base width
    (the target's) every muP factor is 1, so in width the model is the user's own; in depth it
    carries CompleteP's factors relative to the base depth (by default the proxy's), which is
    where the proxy's values were tuned. Transferred values apply to it unchanged."""
    return MuPWorkload(workload, scaling.target_width, scaling.base, scaling.readout, **depth_settings(scaling, target=True))


def mup_factors(model: nn.Module, optimizer: str) -> dict[str, tuple[float, float]]:
    """(lr factor, weight-decay factor) per parameter name, exactly as mup's optimizers set them.

    Adam/AdamW (`mup.MuAdam`): matrix-like parameters (two width dimensions) get lr / width_mult
    and weight_decay * width_mult; vector-like ones are unchanged. SGD (`mup.MuSGD`): vector-like
    get lr * width_mult, matrix-like lr / (fan-in mult / fan-out mult), weight decay inversely.
    """
    if optimizer not in ("sgd", "adam", "adamw"):
        raise ValueError(f"optimizer {optimizer!r} has no muP rule here; expected 'sgd', 'adam' or 'adamw'")
    factors: dict[str, tuple[float, float]] = {}
    for name, param in model.named_parameters():
        infshape = getattr(param, "infshape", None)
        if infshape is None:
            raise ScalingError(
                f"parameter {name!r} has no muP shape; build the model with MuPWorkload.build_model "
                "(mup.set_base_shapes) before asking for its learning-rate factors"
            )
        ninf = infshape.ninf()
        if ninf > 2:
            raise ScalingError(f"parameter {name!r} has {ninf} width dimensions; muP handles at most 2")
        if optimizer in ("adam", "adamw"):
            scale = infshape.width_mult() if ninf == 2 else 1.0
            factors[name] = (1.0 / scale, scale)
        elif ninf == 1:
            scale = infshape.width_mult()
            factors[name] = (scale, 1.0 / scale)
        elif ninf == 2:
            ratio = infshape.fanin_fanout_mult_ratio()
            factors[name] = (1.0 / ratio, ratio)
        else:
            factors[name] = (1.0, 1.0)
    return factors


def mup_normal_init_(model: nn.Module, std: float) -> None:
    """GPT-2's init under muP: Linear/Embedding weights ~ N(0, std) with mup's width scaling
    (matrix-like weights std * width_mult**-0.5), biases zero. LayerNorm keeps ones and zeros."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                mup.init.normal_(module.weight, std=std)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()


def _swap_readout(model: nn.Module, name: str, workload_name: str) -> None:
    """Replace the output `nn.Linear` named `name` by a `mup.MuReadout` holding the same weights."""
    try:
        layer = model.get_submodule(name)
    except AttributeError:
        linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        guess = f" The model's last nn.Linear is {linears[-1]!r}." if linears else ""
        raise ScalingError(
            f"muP scaling: the model of workload {workload_name!r} ({type(model).__name__}) has no module named "
            f"{name!r}, so muP cannot find its output layer.{guess} Fix: name the output nn.Linear {name!r} in "
            f"the model, or set `scaling.readout` to its name (YAML `scaling: {{readout: <module name>}}`)."
        ) from None
    if isinstance(layer, mup.MuReadout):
        return
    if type(layer) is not nn.Linear:
        raise ScalingError(
            f"muP scaling: the readout {name!r} of workload {workload_name!r} is a {type(layer).__name__}, "
            "not an nn.Linear; muP replaces the output nn.Linear by mup.MuReadout. Fix: make the output layer "
            "an nn.Linear (or a mup.MuReadout) or point `scaling.readout` at it."
        )
    tied = any(param is layer.weight for owner, param in model.named_parameters(remove_duplicate=False)
               if not owner.startswith(f"{name}."))
    if tied:  # the output head is another layer's weight (an embedding's): keep the tie, as mup prescribes
        readout = mup.MuSharedReadout(layer.weight, bias=layer.bias is not None)
    else:
        readout = mup.MuReadout(layer.in_features, layer.out_features, bias=layer.bias is not None)
    readout.to(device=layer.weight.device, dtype=layer.weight.dtype)
    with torch.no_grad():
        if not tied:
            readout.weight.copy_(layer.weight)
        if layer.bias is not None:
            readout.bias.copy_(layer.bias)
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, readout)


def _rescale_to_mup(model: nn.Module) -> None:
    """`mup.set_base_shapes`'s rescaling of PyTorch's default init to muP, except a readout tied to
    an embedding: its weight is the embedding's (constant variance, already muP's for both uses),
    not an nn.Linear's 1/fan_in init, so only its bias is rescaled."""
    for module in model.modules():
        if isinstance(module, mup.MuReadout) and not isinstance(module, mup.MuSharedReadout):
            module._rescale_parameters()
        elif isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)):
            mup.layer.rescale_linear_bias(module)


def _build_shapes_only(workload: Workload, config: Mapping[str, Any]) -> nn.Module:
    """The model on the meta device (no memory, no RNG); on the CPU if the factory cannot do meta."""
    try:
        with torch.device("meta"):
            return workload.build_model(config)
    except Exception:  # a factory that computes on tensors while building: build it for real
        return workload.build_model(config)


def attention_scale_problems(base: nn.Module, delta: nn.Module) -> list[str]:
    """Warnings for attention layers whose logits are scaled by 1/sqrt(head_dim) instead of muP's 1/d.

    Recognises `nn.MultiheadAttention` and any module exposing `head_dim` and `scale` (the factor
    on q.k). Comparing the base and delta models tells whether head_dim grows with width.
    """
    delta_modules = dict(delta.named_modules())
    problems = []
    for name, module in base.named_modules():
        other = delta_modules.get(name)
        if isinstance(module, nn.MultiheadAttention):
            problems.append(
                f"muP scaling: attention layer {name!r} is nn.MultiheadAttention, which always scales logits by "
                "1/sqrt(head_dim); muP needs 1/head_dim. Fix: write the attention with "
                "F.scaled_dot_product_attention(..., scale=1/head_dim)."
            )
            continue
        head_dim, scale = getattr(module, "head_dim", None), getattr(module, "scale", None)
        if not isinstance(head_dim, int) or not isinstance(scale, (int, float)) or other is None:
            continue
        if other.head_dim != head_dim:  # head_dim scales with width: measure the exponent
            exponent = math.log(other.scale / scale) / math.log(other.head_dim / head_dim)
            if abs(exponent + 1.0) > 0.1:
                problems.append(
                    f"muP scaling: attention layer {name!r} scales logits by head_dim**{exponent:.2f} and its "
                    f"head_dim grows with width ({head_dim} -> {other.head_dim}); muP needs 1/head_dim or the "
                    "proxy's optimum will not transfer. Fix: set `attn_scale: inv_d` (scale = 1/head_dim)."
                )
        elif math.isclose(scale * math.sqrt(head_dim), 1.0, rel_tol=1e-6) and head_dim > 1:
            problems.append(
                f"muP scaling: attention layer {name!r} scales logits by 1/sqrt(head_dim); muP prescribes "
                f"1/head_dim. Harmless here because head_dim stays {head_dim} at every width, but set "
                "`attn_scale: inv_d` to stay muP-correct if head_dim is ever scaled."
            )
    return problems


def _reads_residual_mult(workload: Workload, config: Mapping[str, Any], blocks: str) -> bool:
    """Whether the residual blocks' outputs change with `residual_mult` (same weights, one eval batch)."""
    inputs = workload.eval_batches(config)[0][0][:2]
    outputs = []
    for mult in (1.0, 2.0):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = workload.build_model({**config, RESIDUAL_MULT: mult}).eval()
        seen: list[torch.Tensor] = []
        hooks = [
            module.register_forward_hook(lambda _m, _i, out: seen.append(out) if isinstance(out, torch.Tensor) else None)
            for module in model.get_submodule(blocks).children()
        ]
        with torch.no_grad():
            model(inputs)
        for hook in hooks:
            hook.remove()
        outputs.append(seen)
    return any(not torch.equal(a, b) for a, b in zip(*outputs))
