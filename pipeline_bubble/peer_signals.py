"""What the other ranks of a pipeline job on this host are doing: where they are, and whether on a core.

Why arrivals. A stage waiting in an exchange cannot see its neighbour coming: a blocking gloo receive
cannot share its thread with guest work, and a gloo `irecv` cannot be polled. Without a signal
the executor must guess each window in advance, and a window varies several-fold from batch to
batch on a busy host, so a guess either wastes most of the window or overruns it. With a
signal, a stage running guest steps checks between steps whether its neighbour has arrived and
stops at once, so an overrun is at most one guest step, and the neighbour's arrival time gives
the exact window length of every exchange, harvested or not. Since both sides of an exchange
signal, whichever arrives first fills the wait and the other finds it ready: sends fill their
waits as well as receives, and no exchange is stretched from both ends.

Why cores. On CPU a stage's wait is idle hardware only while the host has a core that no rank
of the job is using; when there are more ranks than cores, the waiting stage's core is running
another stage. So each rank also shows whether its thread is on a core (everywhere but inside a
blocking exchange), and a CPU guest step starts only if it leaves the job's ranks their cores;
on a host with more of the job's threads than cores, only if it also leaves a core free for a
rank that wakes up during the step.

How. Each rank owns a small shared-memory page (a file in `/dev/shm`, which is never shared
between hosts). It holds the threads the rank has on a core (0 while it is blocked in an
exchange) and the time (`time.monotonic`, one clock for all processes of a host) at which it
entered each blocking instruction (sends and receives of activations and gradients, the loss
broadcast), counted from the moment it was instrumented. An instruction is matched to its
counterpart by count: the n-th `RecvGrad` of stage s waits for the n-th `SendGrad` of stage
s+1, and that send for this receive. The pages are exchanged once (the constructor is
a collective on the default process group); a rank whose page cannot be opened here, because it
runs on another host (or a host has no `/dev/shm`), sends no signals, and the executor falls
back to predicting the windows of exchanges with it. Once every rank has mapped the pages it
reads, the files are removed (the mappings stay), so a killed rank leaves nothing behind.

A page is a sequence of float64: the rank's threads on a core, then per kind the count of
announcements and a ring of the last `_RING` stamps. The owner writes a stamp before its count,
so a reader that sees the count sees the stamp (x86 keeps stores in order; elsewhere a torn read
can only misjudge one window).
"""

from __future__ import annotations

import mmap
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from hpo.base.machine import usable_cpus
from pipeline_bubble.train_schedule import BLOCKING, EXCHANGES

#: The blocking instructions a stage announces as it enters them, in page order.
ANNOUNCED = BLOCKING
#: Stamps kept per kind; a sender is never more than one exchange ahead of its receiver.
_RING = 64
_KIND_SIZE = 1 + _RING
_ON_CORE = 0  # where a page holds its rank's threads on a core
_KINDS = 1  # where its announcements start
_PAGE_BYTES = 8 * (_KINDS + len(ANNOUNCED) * _KIND_SIZE)
_PAGE_DIR = Path("/dev/shm")


class _Page:
    """One rank's page: written by its owner, read by the ranks of the same host."""

    def __init__(self, path: Path, *, create: bool):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL if create else os.O_RDONLY, 0o600)
        try:
            if create:
                os.ftruncate(fd, _PAGE_BYTES)
            self._map = mmap.mmap(fd, _PAGE_BYTES, access=mmap.ACCESS_WRITE if create else mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self.values = memoryview(self._map).cast("d")

    @property
    def on_core(self) -> float:
        return self.values[_ON_CORE]

    @on_core.setter
    def on_core(self, threads: float) -> None:
        self.values[_ON_CORE] = threads

    def count(self, kind: int) -> int:
        return int(self.values[_KINDS + kind * _KIND_SIZE])

    def stamp(self, kind: int, number: int) -> float:
        """When the `number`-th (1-based) announcement of `kind` was made."""
        return self.values[_KINDS + kind * _KIND_SIZE + 1 + (number - 1) % _RING]

    def announce(self, kind: int, now: float) -> None:
        base = _KINDS + kind * _KIND_SIZE
        number = int(self.values[base]) + 1
        self.values[base + 1 + (number - 1) % _RING] = now
        self.values[base] = number


@dataclass
class PeerArrival:
    """The neighbours one blocking call waits for, and the announcement number it waits on."""

    peers: list[_Page]
    kind: int
    number: int

    def arrived(self) -> bool:
        return all(page.count(self.kind) >= self.number for page in self.peers)

    def arrival_time(self) -> float | None:
        """When the last of the neighbours arrived (`time.monotonic`); None while one has not."""
        if not self.arrived():
            return None
        return max(page.stamp(self.kind, self.number) for page in self.peers)


class PeerSignals:
    """This rank's page and the pages of the job's other ranks on this host, as seen from one engine.

    `enter(name)` is called as the engine enters each blocking instruction: it announces the
    arrival and returns the `PeerArrival` of the other side to watch, or None when that side is
    on another host. The instruction itself runs inside `blocked()`.
    """

    def __init__(self, engine, *, synchronize_cuda: bool = False):
        """Create this rank's page and open the others' here. A collective: every rank calls it.

        `synchronize_cuda`: the job stages CUDA tensors through the host (gloo), so a stage is
        at a send only once its kernels are done; announcing a send then waits for them too.
        """
        self._stage, self._stages = engine.stage_id, engine.num_stages
        self._stage_rank = engine.grid.stage_to_global
        self.synchronize_cuda = synchronize_cuda
        self._entered = [0] * len(ANNOUNCED)
        self._own: _Page | None = None
        path: str | None = None
        if _PAGE_DIR.is_dir() and os.access(_PAGE_DIR, os.W_OK):
            path = str(_PAGE_DIR / f"hpo-bubble-signals-{secrets.token_hex(8)}")
            self._own = _Page(Path(path), create=True)
            self._own.on_core = torch.get_num_threads()
        everyone: list[str | None] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, path)
        #: The other ranks' pages that are on this host, by global rank.
        self._peers = {
            rank: _Page(Path(other), create=False)
            for rank, other in enumerate(everyone)
            if other is not None and other != path and Path(other).exists()
        }
        dist.barrier()  # every page is mapped by all its readers: the file is no longer needed
        if path is not None:
            Path(path).unlink()
        self._cpus = usable_cpus()
        #: Every rank's page shows its threads now: they are all in the collective above.
        self._oversubscribed = self._own is not None and self._busy() > self._cpus

    def enter(self, name: str) -> PeerArrival | None:
        if name not in ANNOUNCED:
            return None
        kind = ANNOUNCED.index(name)
        self._entered[kind] += 1
        if self._own is None:
            return None
        sends = name.startswith("Send") or (name == "LossBroadcast" and self._last)
        if sends and self.synchronize_cuda:  # free: the host-staged send waits for the kernels anyway
            torch.cuda.current_stream().synchronize()
        self._own.announce(kind, time.monotonic())
        if name == "LossBroadcast":  # the last stage sends it to all the others
            stages = [s for s in range(self._stages) if s != self._stage] if self._last else [self._stages - 1]
            other = name
        else:
            offset, other = EXCHANGES[name]
            stages = [self._stage + offset]
        ranks = [self._stage_rank(s) for s in stages]
        if any(rank not in self._peers for rank in ranks):
            return None
        return PeerArrival([self._peers[rank] for rank in ranks], ANNOUNCED.index(other), self._entered[kind])

    @contextmanager
    def blocked(self) -> Iterator[None]:
        """Shows the other ranks that this one is off its core while it waits in an exchange."""
        if self._own is None:
            yield
            return
        threads = self._own.on_core
        self._own.on_core = 0
        try:
            yield
        finally:
            self._own.on_core = threads

    def core_free(self) -> bool:
        """Whether a guest step on this rank's core takes no core from the job (see the module doc).

        True where the pages are missing: without them nothing is known."""
        if self._own is None:
            return True
        headroom = self._own.on_core if self._oversubscribed else 0.0
        return self._busy() + headroom <= self._cpus

    def _busy(self) -> float:
        """Threads the job's ranks on this host have on a core, this one's included."""
        return self._own.on_core + sum(page.on_core for page in self._peers.values())

    @property
    def _last(self) -> bool:
        return self._stage == self._stages - 1

