"""The power layer of the rigid replay: node power states, driven by a policy that names the
``"power"`` layer (CES).

Off and booting nodes hold all their GPUs as taken in the cluster's
``FreeGPUs``, so no policy can place anything on them. At every decision
instant the layer (1) finishes boots that are due, (2) boots at once the
powered-down nodes that a waiting job could start on (what ``select_starts``
would do if every node were on), and (3) every ``interval`` seconds moves the
powered node count towards CES's target: booting lowest-index nodes first,
powering down idle highest-index nodes only while no job waits.

It also measures how long a job waited on nodes CES had powered down
(``max_power_wait_s``: from when the nodes it waits for began to boot until it
starts); CES promises at most the boot delay. A better-ranked job that arrives
meanwhile may take a booting node first; the job overtaken then waits for
another node, booted at once, which is contention, not power.
"""

from __future__ import annotations

import math
from array import array

from ..cluster import FreeGPUs
from ..jobs import Trace
from ..policies._base import PowerHooks
from ..policies.pending_queue import PendingQueue, select_starts
from .layer import Instant
from .run_log import RunLog

OFF, BOOTING, ON = 0, 1, 2


class PowerLayer:
    """Nodes on, off and booting (``layer.ReplayLayer``); the trace does not matter to them."""

    def __init__(self, trace: Trace, policy: PowerHooks, free: FreeGPUs):
        self.policy, self.free = policy, free
        self.cap = free.cap
        self.state = [ON] * len(self.cap)
        self.ready: dict[int, float] = {}
        self.next_tick = 0.0
        self.t, self.on = array("d"), array("d")
        self.powered = len(self.cap)
        self.blocked: dict[int, float] = {}   # job -> when the nodes it waits on began to boot
        self.max_wait = 0.0
        self.boots = self.shutdowns = 0
        self.unbooted_runnable = 0            # instants a runnable job needed an off, non-booting node

    def pending(self, queue: PendingQueue) -> bool:
        """Jobs still wait: for nodes to boot, maybe."""
        return len(queue) > 0

    def next_time(self) -> float:
        return min(min(self.ready.values(), default=math.inf), self.next_tick)

    def _log(self, now: float) -> None:
        if self.t and self.t[-1] == now:
            self.on[-1] = self.powered
        else:
            self.t.append(now)
            self.on.append(self.powered)

    def _boot(self, node: int, now: float) -> None:
        self.state[node] = BOOTING
        self.ready[node] = now + self.policy.power.boot_delay
        self.powered += 1
        self.boots += 1

    def begin(self, now: float) -> None:
        """Nodes whose boot is done join the cluster."""
        for node in [n for n, t in self.ready.items() if t <= now]:
            del self.ready[node]
            self.state[node] = ON
            self.free.give(((node, self.cap[node]),))

    def _what_if(self, queue: PendingQueue, count_off: bool):
        """Starts if booting nodes (and off ones, if ``count_off``) were on."""
        hyp = self.free.copy()
        for n, s in enumerate(self.state):
            if s == BOOTING or (s == OFF and count_off):
                hyp.give(((n, self.cap[n]),))
        return select_starts(queue.copy(), hyp, self.policy.backfill)

    def end(self, instant: Instant) -> None:
        """After the instant's starts: boot for waiting jobs, then follow the target."""
        now, queue = instant.now, instant.queue
        self.policy.record(now, instant.busy + queue.demand())
        asleep = self.powered < len(self.cap)
        runnable = self._what_if(queue, True) if asleep and len(queue) else []
        for jid, placement in runnable:
            for node, _ in placement:
                if self.state[node] == OFF:
                    self._boot(node, now)
        if runnable:  # check: nothing runnable is left waiting on a node that is not booting
            self.unbooted_runnable += len(self._what_if(queue, False)) != len(runnable)
        waiting = {}
        for jid, placement in runnable:  # since when the nodes it now waits for have booted
            asleep_nodes = [node for node, _ in placement if self.state[node] != ON]
            waiting[jid] = max((self.ready[node] - self.policy.power.boot_delay
                                for node in asleep_nodes), default=now)
        for jid in list(self.blocked):
            if jid not in waiting:
                since = self.blocked.pop(jid)
                if jid not in queue:  # it started
                    self.max_wait = max(self.max_wait, now - since)
        self.blocked.update(waiting)
        if now >= self.next_tick:
            self.next_tick = now + self.policy.interval
            spec = self.free.spec
            target = self.policy.target_nodes(now, spec.gpus_per_node, len(self.cap))
            for n in range(len(self.cap)):
                if self.powered >= target:
                    break
                if self.state[n] == OFF:
                    self._boot(n, now)
            if not len(queue):
                for n in range(len(self.cap) - 1, -1, -1):
                    if self.powered <= target:
                        break
                    if self.state[n] == ON and self.free.free[n] == self.cap[n]:
                        self.free.take(((n, self.cap[n]),))
                        self.state[n] = OFF
                        self.powered -= 1
                        self.shutdowns += 1
        self._log(now)

    def report(self, log: RunLog) -> None:
        log.extra.update({"boots": self.boots, "power_downs": self.shutdowns,
                          "max_power_wait_s": self.max_wait, "runnable_left_unbooted": self.unbooted_runnable})
        log.power_t, log.power_on, log.power_model = self.t, self.on, self.policy.power
