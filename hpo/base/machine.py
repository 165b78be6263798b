"""What machine this is, read without importing torch: for measurements that are only true where they were taken.

A profile or an interference table measured on one machine predicts that machine. Whoever reads
one elsewhere must be told, so measurements carry a `fingerprint` and a reader compares it with
its own (`differences`). Everything here reads files and package metadata only, so a torch-free
process (the pipeline replayer, `hpo --help`) can describe its machine too.
"""

from __future__ import annotations

import functools
import os
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

#: The fingerprint's keys that name the hardware and software a timing depends on (not the host's name).
HARDWARE = ("machine", "cpu", "cpus", "accelerators")
SOFTWARE = ("python", "torch", "deepspeed")


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (or what `platform` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def usable_cpus() -> float:
    """CPUs this process may use: its affinity, capped by a cgroup v2 quota if there is one."""
    cpus = float(len(os.sched_getaffinity(0)))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cpus = min(cpus, int(quota) / int(period))
    except (OSError, ValueError):
        pass
    return cpus


def accelerators() -> list[str]:
    """The NVIDIA GPUs the driver lists (model names), without initialising CUDA; [] if none or unreadable."""
    names = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            for line in info.read_text().splitlines():
                if line.startswith("Model:"):
                    names.append(line.split(":", 1)[1].strip())
        except OSError:
            continue
    return names


def _package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def fingerprint() -> dict:
    """This machine and the software that times on it: the host's name, hardware (`HARDWARE`) and versions (`SOFTWARE`)."""
    return dict(_fingerprint())


@functools.cache
def _fingerprint() -> dict:  # reading package metadata takes tens of ms; a process's machine does not change
    return {
        "host": platform.node(),
        "machine": platform.machine(),
        "cpu": cpu_name(),
        "cpus": usable_cpus(),
        "accelerators": accelerators(),
        "python": platform.python_version(),
        "torch": _package_version("torch"),
        "deepspeed": _package_version("deepspeed"),
    }


def differences(recorded: dict, here: dict | None = None) -> list[str]:
    """What differs between the machine a measurement was `recorded` on and `here` (default: this one),
    one 'key: recorded -> here' per hardware or software key; [] when nothing a timing depends on differs."""
    here = fingerprint() if here is None else here
    return [
        f"{key}: {recorded.get(key)!r} -> {here.get(key)!r}"
        for key in (*HARDWARE, *SOFTWARE)
        if recorded.get(key) != here.get(key)
    ]
