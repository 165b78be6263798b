"""The differential fuzzer's long profile: thousands of generated models, counted by the path fusion takes.

Each example is a model from the grammar in `tests/fusion_fuzz.py` (torch.nn layers and forward
idioms; B members with every per-member hyperparameter drawn, default eps), checked as
`tests/test_fusion_fuzz.py` checks it: fusion (its guard on) refuses it with a FusionError naming
a construct it does not take, or every member trains, fused, exactly as it trains alone (float64,
1e-12 relative or within the member's own rounding noise). The table gives the share on each path
(stacked, vmap, refused), the refusals by reason, and every example that was accepted and
different, refused by the differential check, or crashed (each one a bug; the run then exits 1).

    python benchmarks/fusion_fuzz.py --examples 2000 --seed 0 --json benchmarks/results/fusion_fuzz_cpu.json

A run cut short by SIGINT (Ctrl-C, or `timeout -s INT 1200 python benchmarks/fusion_fuzz.py ...` for
a time budget) still prints and writes the examples it finished, marked `interrupted`.

One torch thread; the JSON holds the counts, the reasons, the failures (with the model spec and
the members' configs), the git commit, the machine and the wall time.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from benchmarks.fusion_throughput import git_commit  # noqa: E402
from tests.fusion_fuzz import Case, cases, check  # noqa: E402


def reason_kind(reason: str) -> str:
    """A refusal's reason without its particulars (names, numbers), to count by kind: the guard's
    (a fused group that trains otherwise than its members alone), or fusing's."""
    first = reason.split(";")[0]
    general = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", re.sub(r"'[^']*'", "'...'", first))
    if "does not train as its members do alone" in reason:
        return "guard: " + general.split("alone: ", 1)[1]
    return "fusing: " + general[-160:]


def run(examples: int, start_seed: int) -> dict[str, Any]:
    paths: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    refused: dict[str, list[dict[str, str]]] = {}  # a few refused cases of each kind, whole
    failures: list[dict[str, Any]] = []

    def fail(kind: str, message: str, case: Case) -> None:
        paths[kind] += 1
        failures.append({"kind": kind, "message": message, "case": repr(case)})
        print(f"{kind.upper()} at example {sum(paths.values())}: {message}\n    {case!r}", flush=True)

    @seed(start_seed)
    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(cases())
    def one(case: Case) -> None:
        try:
            outcome = check(case)
        except AssertionError as difference:  # accepted and different, or refused by the differential check
            fail("different", str(difference), case)
            return
        except Exception as error:  # a crash: fusion should refuse or train, never raise otherwise
            fail("crashed", "".join(traceback.format_exception_only(error)).strip(), case)
            return
        paths[outcome.path] += 1
        if outcome.reason:
            kind = reason_kind(outcome.reason)
            reasons[kind] += 1
            if len(refused.setdefault(kind, [])) < 3:
                refused[kind].append({"message": outcome.reason, "case": repr(case)})
        done = sum(paths.values())
        if done % 100 == 0:
            print(f"{done} examples: {dict(paths)}", flush=True)

    started = time.perf_counter()
    interrupted = False
    try:
        one()
    except KeyboardInterrupt:  # a run cut short (Ctrl-C, `timeout -s INT`) still reports what it checked
        interrupted = True
    total = sum(paths.values())
    return {
        "examples": total,
        "interrupted": interrupted,
        "paths": dict(paths),
        "shares": {path: count / total for path, count in paths.items()},
        "refusals": dict(reasons.most_common()),
        "refused_examples": refused,
        "failures": failures,
        "wall_s": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000, help="models to generate and check (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    parser.add_argument("--json", type=Path, help="write the counts here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    checked_out = git_commit()  # the code the examples run on, before anything changes the checkout
    results = run(args.examples, args.seed)
    print(f"{results['examples']} examples in {results['wall_s']:.0f} s" + (" (interrupted)" if results["interrupted"] else ""))
    for path, share in sorted(results["shares"].items()):
        print(f"  {path:>10}: {results['paths'][path]:>6}  ({share:.1%})")
    for reason, count in results["refusals"].items():
        print(f"  refused {count:>5}x  {reason}")
    for failure in results["failures"]:
        print(f"  {failure['kind'].upper()}: {failure['message']}\n    {failure['case']}")
    results.update(
        seed=args.seed,
        commit=checked_out,
        machine={"processor": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version()},
        command=" ".join(["python", "benchmarks/fusion_fuzz.py", *sys.argv[1:]]),
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")
    sys.exit(1 if results["failures"] else 0)


if __name__ == "__main__":
    main()
