"""Lucid's profiling partition in the live allocator: who is profiled, where, and what it shows.

Lucid (ASPLOS'23) runs every new job briefly on a small profiling partition before it
joins the main queue: jobs that end within that time (debugging runs) never queue, and
the rest leave with their behaviour measured, which decides whom they may share GPUs with.
The simulator draws a trace job's workload from the table (trace jobs name no model);
live, the measurement is real:

- a job submitted without a ``workload`` that fits on one node starts alone (whole GPUs,
  never packed) on the partition: the first ``Lucid.profile_nodes`` GPU nodes in the
  order the allocator first saw them, always leaving one node to run jobs on;
- after ``Lucid.profile_s`` seconds of running (counted from when every rank has imported
  the job's code and runs it) it is stopped like any other stop: it checkpoints, and
  resumes on the main partition;
- its ranks report the peak memory it added (``memory_probe``, the yardstick
  ``hpo profile colocate`` wrote into the table), and ``classify`` names the table's
  workload nearest to it; that class makes it a packing candidate like a named workload.

Memory is the one feature measured here: Lucid also profiles GPU utilisation, which a
fake-GPU test cluster cannot show, so two workloads of equal memory are not told apart.

>>> from scheduler_bridge.interference import InterferenceTable
>>> from scheduler_bridge.policies.lucid import Lucid
>>> p = LiveProfiling(Lucid(InterferenceTable({("a", "a"): 1.1}, {"light": 10.0, "heavy": 400.0}),
...                         profile_nodes=1))
>>> p.classify(300.0), p.classify(2.0)
('heavy', 'light')
>>> p.partition(["n1", "n2", "n3"]), p.partition(["n1"])
(['n1'], [])
"""

from __future__ import annotations

import math

from ..policies.lucid import Lucid


class LiveProfiling:
    def __init__(self, lucid: Lucid):
        self.lucid = lucid
        self.seconds = lucid.profile_s

    def partition(self, nodes: list[str]) -> list[str]:
        """The profiling nodes among the alive GPU ``nodes`` (in first-seen order)."""
        return nodes[:min(self.lucid.profile_nodes, max(len(nodes) - 1, 0))]

    def classify(self, memory_mb: float) -> str:
        """The table's workload whose memory alone is nearest (by ratio) to ``memory_mb``."""
        table = self.lucid.table.memory_mb
        return min(sorted(table), key=lambda w: abs(math.log(max(memory_mb, 1e-3) / table[w])))
