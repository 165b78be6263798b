"""muP's coordinate check: do activation sizes stay flat as the model gets wider?

For each width, a few seeds train the model for a few steps on one fixed batch, with the same
optimizer and per-parameter muP factors the sweep uses (`build_torch_optimizer` with the
workload's `lr_multipliers`); forward hooks record every module's mean |output| (mup's `l1`
statistic) at each step. The verdict fits log2(size) against log2(width) per module and step.
Under muP the slopes stay near 0; under standard parametrisation, after one Adam step, hidden
and output activations grow like width**0.5 to width**1. Sizes may shrink with width (muP's
readout output does at initialisation, as width**-0.5); growth is what breaks transfer, so a
module fails when its slope exceeds `tolerance`.

`depth_coord_check` asks the same across depth (CompleteP, Dey et al. 2025): models of 2, 4, 8...
residual blocks, depth-scaled as the proxy sweep trains them, against log2(depth), on the modules
every depth has. Without depth scaling the residual stream leaving the blocks grows with depth.

Example::

    report = coord_check(workload, widths=[64, 128, 256, 512], base_width=512, plot_path="coord.png")
    assert report.ok, report.summary()
    depth_coord_check(char_gpt, depths=[2, 4, 8, 16], plot_path="coord_depth.png").raise_for_failure()
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import torch

from hpo.base.figures import subplots
from hpo.base.hparams import OptimHParams, workload_optimizer
from hpo.scaling._depth import depth_contract_problem
from hpo.scaling._mup import MuPWorkload, ScalingError
from hpo.base.workload import Workload

if TYPE_CHECKING:
    from hpo.scaling._config import ScalingConfig


@dataclass
class CoordCheckReport:
    """Verdict of a coordinate check: `ok`, each module's worst slope, and the offenders."""

    ok: bool
    parametrization: str
    tolerance: float
    points: list[int]  # the widths (or depths) compared
    steps: int
    slopes: dict[str, float]  # module -> largest slope of log2(mean |output|) vs log2(width or depth) over steps
    offending: dict[str, float]  # modules whose slope exceeds the tolerance
    plot_path: str | None = None
    sizes: list[dict[str, Any]] = field(default_factory=list)  # {"point", "module", "t", "l1"}
    dimension: str = "width"  # or "depth"
    notes: list[str] = field(default_factory=list)  # what the model's structure shows that the check may not

    def raise_for_failure(self) -> "CoordCheckReport":
        """Raise `ScalingError` with the offending layers unless the check passed; else return self."""
        if not self.ok:
            raise ScalingError(self.summary())
        return self

    def summary(self) -> str:
        head = (
            f"coordinate check ({self.parametrization}, {self.dimension}s {self.points}, {self.steps} steps): "
            f"{'OK' if self.ok else 'FAILED'}; tolerance: activation size may grow at most like "
            f"{self.dimension}**{self.tolerance:g}"
        )
        notes = "".join(f" Warning: {note}" for note in self.notes)
        if self.ok:
            worst = max(self.slopes.items(), key=lambda kv: kv[1]) if self.slopes else ("-", 0.0)
            return f"{head}; steepest module {worst[0]!r} at {self.dimension}**{worst[1]:.2f}.{notes}"
        layers = ", ".join(
            f"{name} ({self.dimension}**{slope:.2f})" for name, slope in sorted(self.offending.items(), key=lambda kv: -kv[1])
        )
        if self.dimension == "depth":
            fix = (
                "The model is not depth-scaled: check that every residual branch is multiplied by "
                "config['residual_mult'], that the blocks sit under the workload's `residual_blocks`, and that "
                "no init grows with depth."
            )
        else:
            fix = (
                "The model is not muP-correct: check that the output layer is the readout (scaling.readout), that "
                "custom inits use mup.init or `init_std`, and that no layer multiplies by a width-dependent constant."
            )
        return f"{head}. Activations that grow with {self.dimension}: {layers}. {fix}{notes}"


class CheckOptions(TypedDict, total=False):
    """What both coordinate checks take besides their sizes, with the defaults they use.

    `config`: the rest of every model's config (the width or depth is the check's); `steps`
    (4): training steps recorded per seed, the first at initialisation; `seeds` (3): seeds
    averaged per size; `tolerance`: the largest slope a module's activation size may grow with
    (the scaling's `coord_check_tolerance`, else 0.25); `plot_path`: where to save the PNG;
    `parametrization`: "mup" (default) checks the model as the sweep scales it, "sp" the user's
    model as is, which shows (and tests) what a failure looks like.
    """

    config: Mapping[str, Any] | None
    steps: int
    seeds: int
    tolerance: float | None
    plot_path: str | None
    parametrization: str


def coord_check(
    workload: Workload,
    widths: Sequence[int] | None = None,
    *,
    scaling: "ScalingConfig | None" = None,
    base_width: int | None = None,
    readout: str = "readout",
    **options: Unpack[CheckOptions],
) -> CoordCheckReport:
    """Run muP's coordinate check of `workload` over `widths`; returns the verdict (and saves a PNG).

    `scaling` supplies the base width, readout and tolerance, and by default widths from the
    proxy up by factors of 2 (at most 4 widths, capped at the target). `options`: `CheckOptions`.
    """
    if scaling is not None:
        base_width = base_width or scaling.base
        readout = scaling.readout
        if widths is None:
            widths = _doublings(scaling.proxy, scaling.target_width)
    widths = _points(widths, "widths")
    base_width = base_width or widths[-1]

    def scaled(width: int, mup: bool) -> Workload:
        return MuPWorkload(workload, width, base_width, readout) if mup else workload

    report = _check("width", "width", widths, scaled, scaling, **options)
    if report.parametrization == "mup":  # a few steps at small widths may not show a wrong attention scale
        report.notes = MuPWorkload(workload, widths[0], base_width, readout).attention_problems(options.get("config") or {})
    return report


def depth_coord_check(
    workload: Workload,
    depths: Sequence[int] | None = None,
    *,
    scaling: "ScalingConfig | None" = None,
    base_depth: int | None = None,
    depth_alpha: float = 1.0,
    **options: Unpack[CheckOptions],
) -> CoordCheckReport:
    """The coordinate check across depth: do activation sizes stay flat as blocks are added?

    Each depth's model is depth-scaled (`depth_alpha`, relative to `base_depth`, by default the
    shallowest) as the sweep trains it; the modules compared are those every depth has (the
    embeddings, the first block, the residual stream leaving the blocks, recorded as the last
    block's output `<residual_blocks>[-1]`, the readout). Without
    depth scaling (`parametrization="sp"`) the residual stream and the logits grow with depth.
    `scaling` supplies the base depth, alpha, tolerance, the proxy's width (in muP) and by default
    depths from the proxy up by factors of 2, capped at the target. `options`: `CheckOptions`.
    """
    if problem := depth_contract_problem(workload):
        raise ScalingError(problem)
    width: tuple[int, int] | None = None
    readout = "readout"
    if scaling is not None:
        base_depth = base_depth or scaling.depth_base
        depth_alpha = scaling.depth_alpha
        readout = scaling.readout
        if scaling.scales_width:
            width = (scaling.proxy, scaling.base)
        if depths is None:
            depths = _doublings(scaling.depth_proxy, scaling.target_depth)
    depths = _points(depths, "depths")
    base_depth = base_depth or depths[0]
    # A depth key the factory ignores would compare one model with itself and pass: refuse it as a sweep does.
    contract = MuPWorkload(workload, None, depth=depths[0], base_depth=base_depth, depth_alpha=depth_alpha)
    contract.check_depth_contract(contract.resolve(options.get("config") or {}))

    def scaled(depth: int, mup: bool) -> Workload:
        if mup:
            return MuPWorkload(
                workload, *(width or (None, None)), readout, depth=depth, base_depth=base_depth, depth_alpha=depth_alpha
            )
        return MuPWorkload(workload, *width, readout) if width else workload

    return _check("depth", workload.depth_key, depths, scaled, scaling, **options)


def _doublings(proxy: int, target: int) -> list[int]:
    """The proxy's size up by factors of 2 (at most 4 sizes) below the target, and the target."""
    points = [size for size in (proxy * 2**k for k in range(4)) if size < target]
    return [*points, target] if len(points) < 4 else points


def _points(points: Sequence[int] | None, name: str) -> list[int]:
    if not points or len(points) < 2:
        raise ValueError(f"the coordinate check needs at least two {name}, got {points}")
    return sorted(int(p) for p in points)


def _check(
    dimension: str,
    key: str,
    points: list[int],
    scaled: Callable[[int, bool], Workload],
    scaling: "ScalingConfig | None",
    *,
    config: Mapping[str, Any] | None = None,
    steps: int = 4,
    seeds: int = 3,
    tolerance: float | None = None,
    plot_path: str | None = None,
    parametrization: str = "mup",
) -> CoordCheckReport:
    """Record every module's mean |output| at each point (width or depth, the config's `key`) of
    the workload `scaled` gives (muP-scaled or as is), fit the slopes, judge."""
    if tolerance is None:
        tolerance = scaling.coord_check_tolerance if scaling is not None else 0.25
    if parametrization not in ("mup", "sp"):
        raise ValueError(f"parametrization must be 'mup' or 'sp', got {parametrization!r}")
    sums: dict[tuple[int, str, int], float] = {}
    for point in points:
        workload = scaled(point, parametrization == "mup")
        run_config = workload.resolve({**(config or {}), key: point})
        stream = workload.residual_blocks if dimension == "depth" else None
        for seed in range(seeds):
            for (module, t), l1 in _record_sizes(workload, run_config, seed, steps, stream).items():
                sums[(point, module, t)] = sums.get((point, module, t), 0.0) + l1 / seeds

    sizes = [{"point": w, "module": m, "t": t, "l1": v} for (w, m, t), v in sorted(sums.items())]
    slopes = _slopes(sizes, points)
    offending = {name: slope for name, slope in slopes.items() if slope > tolerance}
    report = CoordCheckReport(
        ok=not offending,
        parametrization=parametrization,
        tolerance=tolerance,
        points=list(points),
        steps=steps,
        slopes=slopes,
        offending=offending,
        sizes=sizes,
        dimension=dimension,
    )
    if plot_path is not None:
        report.plot_path = str(plot_coord_check(report, plot_path))
    return report


def _record_sizes(
    workload: Workload, config: Mapping[str, Any], seed: int, steps: int, stream: str | None = None
) -> dict[tuple[str, int], float]:
    """Mean |output| of every module at steps 1..steps (step 1 is at initialisation). With `stream`
    (the residual blocks' module), the last block's output, the residual stream leaving the blocks,
    is also recorded as `<stream>[-1]`: one name at every depth, and the only place it shows when
    the blocks sit in an nn.ModuleList the model loops over (no module outputs the stream)."""
    torch.manual_seed(seed)
    model = workload.build_model(config)
    named = [(name, m) for name, m in model.named_modules() if name]
    if stream is not None and (blocks := list(model.get_submodule(stream).children())):
        named.append((f"{stream}[-1]", blocks[-1]))
    model.train()
    hparams = OptimHParams.from_config(config)
    optimizer = workload_optimizer(workload, model, hparams)
    inputs, targets = next(iter(workload.train_batches(config, seed=0)))  # one fixed batch, as mup does
    sizes: dict[tuple[str, int], float] = {}

    def hook(name: str, t: int):
        def record(_module, _inputs, output):
            if isinstance(output, torch.Tensor) and output.is_floating_point():
                sizes[(name, t)] = output.detach().abs().mean().item()

        return record

    for t in range(1, steps + 1):
        handles = [m.register_forward_hook(hook(name, t)) for name, m in named]
        loss = workload.loss(model(inputs), targets)
        for handle in handles:
            handle.remove()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return sizes


def _slopes(sizes: list[dict[str, Any]], points: Sequence[int]) -> dict[str, float]:
    """Per module: the largest least-squares slope of log2(l1) on log2(width or depth) over the steps."""
    x = torch.log2(torch.tensor(points, dtype=torch.float64))
    x = x - x.mean()
    series: dict[tuple[str, int], dict[int, float]] = {}
    for row in sizes:
        series.setdefault((row["module"], row["t"]), {})[row["point"]] = row["l1"]
    slopes: dict[str, float] = {}
    for (module, _t), by_point in series.items():
        if len(by_point) != len(points) or min(by_point.values()) <= 0:
            continue  # a module missing at some point (a deeper block), or exactly zero (zero-initialised)
        y = torch.log2(torch.tensor([by_point[w] for w in points], dtype=torch.float64))
        slope = float((x * (y - y.mean())).sum() / (x * x).sum())
        slopes[module] = max(slopes.get(module, float("-inf")), slope)
    return slopes


def plot_coord_check(report: CoordCheckReport, path: str):
    """mup-style plot: mean |output| against width (or depth), one panel per step, one line per module."""
    steps = sorted({row["t"] for row in report.sizes})
    modules = sorted(report.slopes)  # at every point and nonzero: what the verdict judged
    fig, axes = subplots(nrows=1, ncols=len(steps), figsize=(4 * len(steps) + 3, 4), sharey=True, squeeze=False)
    for ax, t in zip(axes[0], steps):
        for module in modules:
            rows = [r for r in report.sizes if r["t"] == t and r["module"] == module]
            bad = module in report.offending
            ax.plot(
                [r["point"] for r in rows],
                [r["l1"] for r in rows],
                marker="o",
                markersize=3,
                linewidth=2.0 if bad else 0.8,
                color="tab:red" if bad else None,
                label=module if t == steps[0] else None,
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_title(f"t={t}")
        ax.set_xlabel(report.dimension)
    axes[0][0].set_ylabel("mean |activation|")
    fig.legend(loc="center right", fontsize=6, ncol=1 + len(modules) // 30)
    verdict = "OK" if report.ok else f"FAILED: {len(report.offending)} layer(s) grow with {report.dimension} (red)"
    fig.suptitle(f"coordinate check, {report.parametrization}: {verdict}")
    fig.tight_layout(rect=(0, 0, 0.8, 0.95))
    fig.savefig(path, dpi=110)
    return path
