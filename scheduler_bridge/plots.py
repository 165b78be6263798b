"""Plots of simulation results: JCT CDF per policy and GPU utilisation over time."""

from __future__ import annotations

import numpy as np


def plot_results(results, path) -> None:
    """Two panels for a list of ``SimResult``: JCT CDF (log x) and utilisation over time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
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
    ax1.legend()
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
