"""Scheduler targets of issues 5 and 13, measured on the shipped traces.

    python benchmarks/scheduler_policies.py [--quick] [--json PATH]
    python benchmarks/scheduler_policies.py --issue13 [--philly-jobs N] [--json PATH]

Issue 13 (``--issue13``; results/scheduler_policies_issue13_cpu.json): Tiresias
(2 queues split at 16 GPU-hours, no promotion) against Pollux's published
Tiresias; then Tiresias, Lucid, QSSF and CES over QSSF side by side on Philly.
Last run (2-CPU box, quiet: load under 1; 265 s, every policy about 3x slower than the 75 s run before it, Tiresias 4.9x):

    Pollux 1.0x, 16x4, mean of 8   avg JCT s   (published)
    tiresias                          3,750    (4,038: 0.93x, target within 15%: met)
    elastic                           2,772    (2,751)  -> tiresias/elastic 1.35x (published 1.47x)
    Philly, 500 GPUs   avg JCT s  avg queue s  p99.9 queue s  on-util     kWh  preemptions
    tiresias              41,105           16          1,865    0.751  344,141     322,357
    lucid                 19,374        6,221        510,040    0.620  301,400           0
    lucid-no-packing      37,559       24,423      4,045,797    0.687  353,390           0
    qssf                  34,335       21,199      4,385,601    0.681  353,102           0
    ces:qssf              34,408       21,272      4,334,472    0.846  332,254           0
    -> Tiresias/Lucid 2.12x (target 1.3x: met; see below); CES on-node
       utilisation 1.24x at +0.3% avg queue (target 1.13x at <= 5%: met),
       34,841 node-hours powered down, 20,848 kWh (5.9%) saved.
    Lucid's gain is packing (without it, 1.09x), and packing follows its interference
    table. The shipped table was measured on this box while it was quiet: two
    one-thread jobs on two cores barely interfere (every slowdown 0.93-1.03), so
    packing is nearly free there. The same run with every pair slowed by one value:
    slowdown 1.0 / 1.2 / 1.4 / 1.6 / 1.8 -> Tiresias/Lucid 2.12 / 1.79 / 1.46 / 1.27 /
    1.10. Lucid's 1.3x holds while packed jobs slow each other by up to about 1.5x;
    measure the table on the target device to know which side a cluster is on.

1. Philly (Pollux's 82,247-job Philly-derived trace) on one pool of 500 GPUs,
   8 per node: FIFO, oracle SJF / SRTF, QSSF (all with greedy backfill; FIFO
   also strict), tuning-aware over QSSF with synthetic tuning jobs.
   Targets: every policy < 60 s of simulation; QSSF avg JCT >= 2.3x lower than
   FIFO and within 15% of oracle SJF (Helios artifact: FIFO 86,072 s, QSSF
   37,324 s, SJF 34,272 s).
2. Pollux workloads (8 x 160 jobs, load 1.0x) on 16 nodes x 4 GPUs: elastic vs
   its fixed-batch baseline (and rigid FIFO at the requested GPUs). Targets:
   >= 2x jobs completed within the 8-hour window and >= 2x lower avg JCT than
   fixed-batch; compared with Pollux's published avg JCT (Pollux 2,751 s,
   Tiresias 4,038 s).
``--quick`` replays the first 10,000 Philly jobs and two Pollux workloads.

Last full run (2-CPU x86_64 box shared with other jobs, Python 3.11, 150 s in all;
wall times vary 2-4x with the box's load):

    Philly, 500 GPUs     avg JCT s   p99 JCT s  avg queue s  util  wall s
    fifo (strict)          931,636   1,572,412      918,500  0.722   2.5
    fifo (backfill)         99,875     940,457       86,739  0.748   4.8
    sjf (oracle)            25,647     401,386       12,511  0.681   3.4
    srtf (oracle)           19,749     301,187        3,700  0.554  10.1
    qssf                    34,335     536,287       21,199  0.681   9.2
    tuning-aware(qssf)      34,335     536,287       21,199  0.681   8.0
      (+ 32,000 GPU-h of tuning work done for free, 10,294 of it in bubbles)
    key-oracle(all)         35,793     613,961       22,658  0.696   2.4  diagnostic
    key-oracle(+-6h)        28,286     407,298       15,150  0.681   1.8  diagnostic
    -> FIFO/QSSF 2.91x (target 2.3x: met); QSSF/SJF 1.34 (target 1.15: missed).
       The trace has no user or job name: ranking by the *true* mean duration of
       a job's (VC, GPUs) key does no better than QSSF, and even the +-6 h key
       mean, which peeks at the future, stays 10% above SJF.

    Pollux, 16x4 GPUs, mean of 8   load 1.0x: avg JCT s / done in 8 h   load 1.5x
    fifo (requested GPUs)                  6,971 / 113.8              10,839 / 143.6
    elastic-fixed-batch                    4,062 / 137.8               5,529 / 194.6
    elastic                                2,772 / 147.4               3,459 / 211.4
    -> fixed/elastic JCT 1.47x, completed 1.07x (targets 2x: missed); elastic is
       within 1% of Pollux's published 2,751 s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler_bridge import (ClusterSpec, Lucid, QueuePolicy, Trace, add_tuning_work,  # noqa: E402
                              default_traces_dir, load_philly, load_pollux, load_profiles,
                              make_policy, simulate)
from scheduler_bridge.interference import InterferenceTable  # noqa: E402

PUBLISHED = {"helios_philly_avg_jct": {"fifo": 86072, "qssf": 37324, "sjf": 34272},
             "pollux_load1_avg_jct": {"pollux": 2751, "tiresias": 4038, "optimus+oracle": 5682}}
KEYS = ("avg_jct", "p50_jct", "p99_jct", "avg_queue", "p999_queue", "makespan", "utilization",
        "avg_rho", "completed", "wall_s", "preemptions", "on_utilization", "energy_kwh",
        "powered_node_hours", "powered_down_node_hours", "boots", "power_downs", "max_power_wait_s",
        "runnable_left_unbooted", "packed_starts", "debug_jobs_finished_in_profiling", "jobs_profiled",
        "profiling_gpu_hours")
POLLUX_POLICIES = ("fifo", "tiresias", "elastic-fixed-batch", "elastic")
#: Lucid rerun with every pair of its table slowed down by one value: how much interference its
#: margin over Tiresias survives, whatever device measured the table (2.0 would never pack: with
#: min_gain 0.1, two jobs must together run at 1.1x of one alone)
UNIFORM_SLOWDOWNS = (1.0, 1.2, 1.4, 1.6, 1.8)


class KeyMeanOracle(QueuePolicy):
    """Diagnostic bound, not a policy: rank by the true geometric-mean duration of the
    job's (VC, GPUs) key, over the whole trace or over jobs submitted within
    +-``window`` s (which peeks at the future). Tells how far any predictor that
    only sees the trace's features (VC, GPUs, time) can get."""

    name = "key-oracle"

    def __init__(self, trace: Trace, window: float | None = None):
        super().__init__(backfill=True)
        import bisect
        import math
        from collections import defaultdict
        by_key = defaultdict(list)
        for j in trace.jobs:
            by_key[(j.vc, j.gpus)].append((j.submit, math.log(max(j.duration, 1.0))))
        self._est = {}
        for key, rows in by_key.items():
            cum = [0.0]
            for _, y in rows:
                cum.append(cum[-1] + y)
            for t, _ in rows:
                lo, hi = 0, len(rows)
                if window is not None:
                    lo = bisect.bisect_left(rows, (t - window,))
                    hi = bisect.bisect_right(rows, (t + window, math.inf))
                self._est.setdefault(key, {})[t] = math.exp((cum[hi] - cum[lo]) / (hi - lo))

    def priority(self, job, remaining, now):
        return self._est[(job.vc, job.gpus)][job.submit] * job.gpus


def _row(s: dict) -> dict:
    return {k: s[k] for k in KEYS if k in s} | {k: v for k, v in s.items() if k.startswith("tuning_")}


def philly(quick: bool) -> dict:
    trace = load_philly(default_traces_dir() / "pollux" / "traces" / "philly.csv")
    if quick:
        trace = Trace(trace.jobs[:10000], trace.source, (), trace.t0)
    cluster = ClusterSpec(500, 8)
    out = {"jobs": len(trace), "gpus": 500, "gpus_per_node": 8, "policies": {}}
    runs = [("fifo-strict", "fifo", False), ("fifo", "fifo", True), ("sjf", "sjf", True),
            ("srtf", "srtf", True), ("qssf", "qssf", True)]
    for label, name, backfill in runs:
        s = simulate(trace, make_policy(name, backfill=backfill), cluster).summary()
        out["policies"][label] = _row(s)
        print(f"  philly {label:12s} avg_jct {s['avg_jct']:>11,.0f} s  wall {s['wall_s']:.1f} s", flush=True)
    # 1,000 tuning jobs x 16 fused groups x 2 GPU-hours = 32,000 GPU-h of tuning work
    for label, policy in (("key-oracle(all)", KeyMeanOracle(trace)),
                          ("key-oracle(+-6h)", KeyMeanOracle(trace, 6 * 3600.0))):
        s = simulate(trace, policy, cluster).summary()
        out["diagnostics"] = out.get("diagnostics", {}) | {label: _row(s)}
        print(f"  philly {label:12s} avg_jct {s['avg_jct']:>11,.0f} s  (diagnostic bound)", flush=True)
    tuned = add_tuning_work(trace, tuning_jobs=100 if quick else 1000, groups=16,
                            group_work=7200.0, pipeline_fraction=0.2, bubble_fraction=0.3, seed=0)
    s = simulate(tuned, make_policy("tuning-aware", base="qssf"), cluster).summary()
    out["policies"]["tuning-aware(qssf)"] = _row(s)
    print(f"  philly tuning-aware  avg_jct {s['avg_jct']:>11,.0f} s  free tuning "
          f"{s['tuning_gpu_hours_free']:,.0f} GPU-h ({s['tuning_gpu_hours_bubbles']:,.0f} in bubbles), "
          f"{s['tuning_jobs_completed']}/{s['tuning_jobs']} tuning jobs done, "
          f"{s['tuning_gpu_hours_lost_to_eviction']:,.0f} GPU-h lost to evictions", flush=True)
    p = out["policies"]
    out["targets"] = {
        "max_wall_s": max(v["wall_s"] for v in p.values()),
        "speed_under_60s": all(v["wall_s"] < 60 for v in p.values()),
        "fifo_over_qssf": p["fifo"]["avg_jct"] / p["qssf"]["avg_jct"],
        "fifo_strict_over_qssf": p["fifo-strict"]["avg_jct"] / p["qssf"]["avg_jct"],
        "qssf_over_sjf": p["qssf"]["avg_jct"] / p["sjf"]["avg_jct"],
        "tuning_aware_ordinary_jobs_unchanged": p["tuning-aware(qssf)"]["avg_jct"] == p["qssf"]["avg_jct"],
    }
    t = out["targets"]
    t["qssf_2.3x_vs_fifo"] = t["fifo_over_qssf"] >= 2.3
    t["qssf_within_15pct_of_sjf"] = t["qssf_over_sjf"] <= 1.15
    return out


def philly_issue13(jobs: int | None) -> dict:
    """Tiresias, Lucid and CES on Philly (500 GPUs, 8 per node), side by side in one run."""
    trace = load_philly(default_traces_dir() / "pollux" / "traces" / "philly.csv")
    if jobs:
        trace = Trace(trace.jobs[:jobs], trace.source, (), trace.t0)
    cluster = ClusterSpec(500, 8)
    out = {"jobs": len(trace), "gpus": 500, "gpus_per_node": 8, "policies": {}}
    for name in ("tiresias", "lucid", "lucid-no-packing", "qssf", "ces:qssf"):
        # ablation: Lucid whose packing never pays (profiling and duration model only)
        policy = Lucid(min_gain=math.inf) if name == "lucid-no-packing" else make_policy(name)
        res = simulate(trace, policy, cluster)
        s = res.summary()
        out["policies"][name] = _row(s)
        if name == "lucid":
            out["lucid_settings"] = repr(policy)
            out["interference_table"] = policy.table.machine
            noisy = sum(min(policy.table.pair(policy.workload_of(trace.jobs[q]),
                                              policy.workload_of(trace.jobs[r]))) < 1
                        for _, q, r, _, _ in res.log.packing)
            out["lucid_packings_on_pairs_measured_below_1"] = noisy
        print(f"  philly {name:16s} avg_jct {s['avg_jct']:>11,.0f} s  avg_queue {s['avg_queue']:>9,.0f} s  "
              f"p99.9 queue {s['p999_queue']:>11,.0f} s  on-util {s['on_utilization']:.3f}  "
              f"wall {s['wall_s']:.1f} s", flush=True)
    p = out["policies"]
    measured = Lucid().table
    out["lucid_uniform_slowdown"] = {}
    for slowdown in UNIFORM_SLOWDOWNS:
        table = InterferenceTable({pair: slowdown for pair in measured.slowdown}, measured.memory_mb,
                                  f"every pair {slowdown}")
        s = simulate(trace, Lucid(table), cluster).summary()
        row = {"avg_jct": s["avg_jct"], "tiresias_over_lucid": p["tiresias"]["avg_jct"] / s["avg_jct"],
               "packed_starts": s["packed_starts"], "p999_queue": s["p999_queue"], "preemptions": s["preemptions"]}
        out["lucid_uniform_slowdown"][str(slowdown)] = row
        print(f"  philly lucid, every pair slowed {slowdown:.1f}x: avg_jct {s['avg_jct']:>11,.0f} s  "
              f"Tiresias/Lucid {row['tiresias_over_lucid']:.2f}  packed starts {s['packed_starts']:,}", flush=True)
    t = {"jct_tiresias_over_lucid": p["tiresias"]["avg_jct"] / p["lucid"]["avg_jct"],
         "jct_tiresias_over_lucid_no_packing": p["tiresias"]["avg_jct"] / p["lucid-no-packing"]["avg_jct"],
         "lucid_preemptions": p["lucid"]["preemptions"],
         "lucid_p999_queue_s": p["lucid"]["p999_queue"],
         "ces_on_util_over_base": p["ces:qssf"]["on_utilization"] / p["qssf"]["on_utilization"],
         "ces_avg_queue_over_base": p["ces:qssf"]["avg_queue"] / p["qssf"]["avg_queue"],
         "ces_powered_down_node_hours": p["ces:qssf"]["powered_down_node_hours"],
         "ces_kwh_saved": p["qssf"]["energy_kwh"] - p["ces:qssf"]["energy_kwh"]}
    t["lucid_1.3x_vs_tiresias"] = t["jct_tiresias_over_lucid"] >= 1.3 and t["lucid_preemptions"] == 0
    t["ces_13pct_on_util_at_5pct_queue"] = (t["ces_on_util_over_base"] >= 1.13
                                            and t["ces_avg_queue_over_base"] <= 1.05)
    out["targets"] = t
    return out


def pollux(quick: bool, folder: str = "workloads") -> dict:
    root = default_traces_dir() / "pollux"
    apps = load_profiles(root / "traces")
    cluster = ClusterSpec(64, 4)
    per = {}
    ids = [1, 2] if quick else list(range(1, 9))
    for w in ids:
        trace = load_pollux(root / folder / f"workload-{w}.csv", root / "traces")
        per[w] = {}
        for name in POLLUX_POLICIES:
            s = simulate(trace, make_policy(name), cluster, profiles=apps, deadline=8 * 3600).summary()
            per[w][name] = _row(s) | {"completed_by_deadline": s["completed_by_deadline"]}
        print(f"  pollux {folder}/workload-{w}: " + ", ".join(
            f"{n} {v['avg_jct']:,.0f} s / {v['completed_by_deadline']} done"
            for n, v in per[w].items()), flush=True)
    mean = {n: {k: statistics.mean(per[w][n][k] for w in ids)
                for k in ("avg_jct", "completed_by_deadline", "utilization", "wall_s")}
            for n in POLLUX_POLICIES}
    el, fx, ti = mean["elastic"], mean["elastic-fixed-batch"], mean["tiresias"]
    targets = {
        "jct_fixed_over_elastic": fx["avg_jct"] / el["avg_jct"],
        "completed_elastic_over_fixed": el["completed_by_deadline"] / fx["completed_by_deadline"],
        "elastic_over_published_pollux": el["avg_jct"] / PUBLISHED["pollux_load1_avg_jct"]["pollux"],
    }
    targets["tiresias_over_published_tiresias"] = ti["avg_jct"] / PUBLISHED["pollux_load1_avg_jct"]["tiresias"]
    targets["tiresias_within_15pct_of_published"] = abs(targets["tiresias_over_published_tiresias"] - 1) <= 0.15
    targets["jct_tiresias_over_elastic"] = ti["avg_jct"] / el["avg_jct"]
    targets["published_tiresias_over_pollux"] = (PUBLISHED["pollux_load1_avg_jct"]["tiresias"]
                                                 / PUBLISHED["pollux_load1_avg_jct"]["pollux"])
    targets["jct_2x"] = targets["jct_fixed_over_elastic"] >= 2
    targets["completed_2x"] = targets["completed_elastic_over_fixed"] >= 2
    return {"folder": folder, "workloads": ids, "gpus": 64, "gpus_per_node": 4, "mean": mean,
            "per_workload": per, "targets": targets}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--issue13", action="store_true",
                    help="only the issue-13 runs: Tiresias / elastic on Pollux 1.0x, and Tiresias, "
                         "Lucid, QSSF, CES on Philly")
    ap.add_argument("--philly-jobs", type=int, default=None, help="replay only the first N Philly jobs")
    args = ap.parse_args(argv)
    if args.issue13:
        return main_issue13(args)
    t = time.time()
    res = {"machine": f"{platform.machine()} {os.cpu_count()} CPUs, {platform.python_version()}",
           "quick": args.quick, "published": PUBLISHED}
    print("Philly, 500 GPUs (8/node)")
    res["philly"] = philly(args.quick)
    print("Pollux workloads, 16 x 4 GPUs")
    res["pollux"] = pollux(args.quick)
    if not args.quick:
        print("Pollux workloads at load 1.5x (context: more contention)")
        res["pollux_load_1.5"] = pollux(False, "workloads-1.5")
    res["total_wall_s"] = time.time() - t

    print("\nPhilly (avg JCT s; published Helios artifact: FIFO 86,072 / QSSF 37,324 / SJF 34,272)")
    print(f"{'policy':20s}{'avg_jct':>12s}{'p99_jct':>12s}{'avg_queue':>12s}{'util':>7s}{'wall_s':>8s}")
    for n, v in res["philly"]["policies"].items():
        print(f"{n:20s}{v['avg_jct']:>12,.0f}{v['p99_jct']:>12,.0f}{v['avg_queue']:>12,.0f}"
              f"{v['utilization']:>7.3f}{v['wall_s']:>8.1f}")
    for n, v in res["philly"].get("diagnostics", {}).items():
        print(f"{n:20s}{v['avg_jct']:>12,.0f}{v['p99_jct']:>12,.0f}{v['avg_queue']:>12,.0f}"
              f"{v['utilization']:>7.3f}{v['wall_s']:>8.1f}   (diagnostic, knows true durations)")
    print("targets:", json.dumps(res["philly"]["targets"], default=str))
    print("\nPollux load 1.0x, mean over workloads (published: Pollux 2,751 s, Tiresias 4,038 s)")
    print(f"{'policy':22s}{'avg_jct':>10s}{'done<=8h':>10s}{'util':>7s}")
    for n, v in res["pollux"]["mean"].items():
        print(f"{n:22s}{v['avg_jct']:>10,.0f}{v['completed_by_deadline']:>10.1f}{v['utilization']:>7.3f}")
    print("targets:", json.dumps(res["pollux"]["targets"], default=str))
    if "pollux_load_1.5" in res:
        print("\nPollux load 1.5x, mean over workloads")
        for n, v in res["pollux_load_1.5"]["mean"].items():
            print(f"{n:22s}{v['avg_jct']:>10,.0f}{v['completed_by_deadline']:>10.1f}{v['utilization']:>7.3f}")
        print("targets:", json.dumps(res["pollux_load_1.5"]["targets"], default=str))
    print(f"\ntotal wall {res['total_wall_s']:.0f} s on {res['machine']}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=str))
    return 0


def main_issue13(args) -> int:
    t = time.time()
    res = {"machine": f"{platform.machine()} {os.cpu_count()} CPUs, {platform.python_version()}",
           "published": PUBLISHED}
    print("Pollux workloads 1.0x, 16 x 4 GPUs")
    res["pollux"] = pollux(args.quick)
    print("Philly, 500 GPUs (8/node)")
    res["philly"] = philly_issue13(args.philly_jobs)
    res["total_wall_s"] = time.time() - t
    print("\nPollux load 1.0x, mean over workloads (published: Pollux 2,751 s, Tiresias 4,038 s)")
    for n, v in res["pollux"]["mean"].items():
        print(f"{n:22s}{v['avg_jct']:>10,.0f}{v['completed_by_deadline']:>10.1f}{v['utilization']:>7.3f}")
    print("targets:", json.dumps(res["pollux"]["targets"], default=str))
    print(f"\nPhilly, {res['philly']['jobs']} jobs, 500 GPUs")
    print(f"{'policy':17s}{'avg_jct':>11s}{'avg_queue':>11s}{'p999_queue':>12s}{'util':>7s}{'on_util':>8s}"
          f"{'kWh':>11s}{'node_h':>9s}{'preempt':>9s}{'wall_s':>8s}")
    for n, v in res["philly"]["policies"].items():
        print(f"{n:17s}{v['avg_jct']:>11,.0f}{v['avg_queue']:>11,.0f}{v['p999_queue']:>12,.0f}"
              f"{v['utilization']:>7.3f}{v['on_utilization']:>8.3f}{v['energy_kwh']:>11,.0f}"
              f"{v['powered_node_hours']:>9,.0f}{v.get('preemptions', 0):>9,}{v['wall_s']:>8.1f}")
    print("targets:", json.dumps(res["philly"]["targets"], default=str))
    print(f"\ntotal wall {res['total_wall_s']:.0f} s on {res['machine']}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
