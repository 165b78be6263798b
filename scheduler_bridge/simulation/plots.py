"""Plots of simulation results: JCT CDF per policy, GPU utilisation over time and,
when any policy powers nodes down (CES), powered-on nodes over time."""

from __future__ import annotations

import numpy as np

from hpo.base.figures import subplots


def plot_results(results, path) -> None:
    """Two panels for a list of ``SimResult``: JCT CDF (log x) and utilisation over time."""
    powered = [r for r in results if len(r.log.power_t)]
    fig, axes = subplots(nrows=1, ncols=3 if powered else 2, figsize=(18 if powered else 12, 4.5))
    ax1, ax2 = axes[0], axes[1]
    for r in results:
        jct = np.sort(r.jobs_frame().jct.dropna().to_numpy())
        if len(jct):
            ax1.plot(np.maximum(jct, 1), np.arange(1, len(jct) + 1) / len(jct), label=r.policy)
        t, u = r.utilization_series()
        if len(t):
            # resample the step function on a grid so large traces stay light
            grid = np.linspace(0, t[-1], 2000)
            idx = np.clip(np.searchsorted(t, grid, side="right") - 1, 0, len(u) - 1)
            ax2.plot(grid / 3600, u[idx], label=r.policy, lw=0.8)
    ax1.set_xscale("log")
    ax1.set(xlabel="job completion time (s)", ylabel="fraction of jobs", title="JCT CDF")
    ax2.set(xlabel="time (h)", ylabel="GPUs busy (fraction)", title="utilisation", ylim=(0, 1.05))
    if powered:
        ax3 = axes[2]
        for r in powered:
            t = np.asarray(r.log.power_t, dtype=float)
            on = np.asarray(r.log.power_on, dtype=float)
            grid = np.linspace(0, t[-1], 2000)
            idx = np.clip(np.searchsorted(t, grid, side="right") - 1, 0, len(on) - 1)
            ax3.plot(grid / 3600, on[idx], label=r.policy, lw=0.8)
        ax3.set(xlabel="time (h)", ylabel="nodes powered on", title="powered-on nodes")
        ax3.legend()
    ax1.legend()
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
