"""In-process assignment: ablab's engine against the GrowthBook Python SDK, side by side.

Both assign the *same* experiment — two variants 50/50, traffic 100 %, one experiment —
and, second case, the same experiment behind targeting (``country in [US, DE]`` and
``app_version >= 2.0.0``, GrowthBook's ``$in`` / ``$vgte``). Each call is timed on its
own with ``perf_counter_ns`` (the timer's own cost, measured on an empty call, is
subtracted), and the two libraries run interleaved in rounds so machine noise hits both.

GrowthBook is timed two ways, as its docs show them: a fresh ``GrowthBook(attributes=…)``
per request, then ``.run(Experiment(…))``; and one long-lived instance with
``set_attributes`` before each ``run``. The ratio is taken against the faster of the two.

Then the batch path: ``assign_indices`` over 1 M unit ids (assignments/s), and a sanity
check that both split ~50/50 and that the batch path agrees with the scalar one.

Goals: ≤ 2 µs median per assignment, ≥ 10× faster than GrowthBook, batch ≥ 2 M/s.

Usage: .venv/bin/python benchmarks/bench_assign.py [--calls 200000] [--batch 1000000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from growthbook import Experiment, GrowthBook
from rich.console import Console
from rich.table import Table

from ablab.platform.assignment import AssignmentConfig, ExperimentSpec, VariantSpec, assign
from ablab.platform.assignment.engine import assign_indices
from ablab.platform.assignment.targeting import Condition, Op

console = Console()
logging.getLogger("growthbook").setLevel(logging.ERROR)

TARGET_ATTRS = {"country": "US", "app_version": "2.3.1", "plan": "pro"}


def ablab_config(*, targeted: bool) -> AssignmentConfig:
    targeting = (
        (Condition("country", Op.in_, ["US", "DE"]), Condition("app_version", Op.semver_gte, "2.0.0")) if targeted else ()
    )
    spec = ExperimentSpec(
        key="prompt-compression",
        salt="prompt-compression",
        control="control",
        traffic=1.0,
        targeting=targeting,
        variants=(
            VariantSpec("control", 1.0, {}),
            VariantSpec("entropy", 1.0, {"compression": {"method": "entropy", "tau": 0.18}}),
        ),
    )
    return AssignmentConfig(experiments=(spec,))


def growthbook_experiment(*, targeted: bool) -> Experiment:
    condition = {"country": {"$in": ["US", "DE"]}, "app_version": {"$vgte": "2.0.0"}} if targeted else None
    return Experiment(
        key="prompt-compression",
        variations=["control", "entropy"],
        weights=[0.5, 0.5],
        coverage=1.0,
        condition=condition,
        hashAttribute="id",
    )


def timer_overhead_ns(samples: int = 100_000) -> float:
    clock = time.perf_counter_ns
    noop = lambda: None
    times = []
    for _ in range(samples):
        t0 = clock()
        noop()
        times.append(clock() - t0)
    return float(np.median(times))


def time_calls(fn: Callable[[str], Any], unit_ids: list[str]) -> list[int]:
    clock = time.perf_counter_ns
    out = []
    append = out.append
    for uid in unit_ids:
        t0 = clock()
        fn(uid)
        append(clock() - t0)
    return out


def contenders(*, targeted: bool) -> dict[str, Callable[[str], Any]]:
    config = ablab_config(targeted=targeted)
    experiment = growthbook_experiment(targeted=targeted)
    base = dict(TARGET_ATTRS) if targeted else {}
    shared = GrowthBook(attributes={"id": "x", **base})

    if targeted:
        def ablab_fn(uid: str) -> Any:
            return assign(config, uid, TARGET_ATTRS)
    else:
        def ablab_fn(uid: str) -> Any:
            return assign(config, uid)

    def gb_fresh(uid: str) -> Any:
        return GrowthBook(attributes={"id": uid, **base}).run(experiment)

    def gb_shared(uid: str) -> Any:
        shared.set_attributes({"id": uid, **base})
        return shared.run(experiment)

    return {"ablab assign": ablab_fn, "GrowthBook (new instance)": gb_fresh, "GrowthBook (reused instance)": gb_shared}


def measure_case(*, targeted: bool, calls: int, rounds: int, overhead: float) -> dict[str, list[float]]:
    fns = contenders(targeted=targeted)
    per_round = max(1, calls // rounds)
    results: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        ids = [f"user-{r}-{i}" for i in range(per_round)]
        for fn in fns.values():  # warm-up, so the first round does not pay imports and caches
            time_calls(fn, ids[:1000])
        gc.disable()
        try:
            for name, fn in fns.items():
                gb_calls = ids if name == "ablab assign" else ids[: max(1000, per_round // 10)]
                results[name].extend(t - overhead for t in time_calls(fn, gb_calls))
        finally:
            gc.enable()
    return results


def split_check(n: int = 100_000) -> dict[str, float]:
    config = ablab_config(targeted=False)
    experiment = growthbook_experiment(targeted=False)
    ids = [f"split-{i}" for i in range(n)]
    ablab_control = sum(assign(config, u)[0].variant == "control" for u in ids) / n
    gb = GrowthBook(attributes={"id": "x"})
    gb_control = 0
    for u in ids:
        gb.set_attributes({"id": u})
        gb_control += gb.run(experiment).value == "control"
    batch = assign_indices(config, ids)["prompt-compression"]
    scalar = np.array([0 if assign(config, u)[0].variant == "control" else 1 for u in ids[:20_000]])
    return {
        "ablab control share": ablab_control,
        "GrowthBook control share": gb_control / n,
        "batch == scalar (20k units)": float(np.array_equal(batch[:20_000], scalar)),
    }


def measure_batch(n: int, repeat: int) -> tuple[float, float, float]:
    """Best wall time and best process CPU time of ``assign_indices`` over ``n`` ids.

    CPU time is reported beside wall time because the machine is shared: wall time
    includes the time other processes held the cores.
    """
    config = ablab_config(targeted=False)
    ids = [f"user-{i}" for i in range(n)]
    assign_indices(config, ids[:10_000])
    best_wall = best_cpu = float("inf")
    index = None
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        index = assign_indices(config, ids)["prompt-compression"]
        best_wall = min(best_wall, time.perf_counter() - w0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    assert index is not None and (index >= 0).all()
    return n / best_wall, best_wall, n / best_cpu


def fmt_ns(ns: float) -> str:
    return f"{ns / 1000:.2f} µs" if ns >= 1000 else f"{ns:.0f} ns"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000, help="ablab calls per case (GrowthBook gets a tenth)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1_000_000)
    parser.add_argument("--batch-repeat", type=int, default=3)
    args = parser.parse_args()

    load = os.getloadavg()
    console.print(
        f"[bold]bench_assign[/] python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    overhead = timer_overhead_ns()
    console.print(f"timer + call overhead subtracted: {overhead:.0f} ns per call")

    table = Table(title="Per-assignment latency, same experiment, one run (interleaved rounds)")
    for col in ("case", "library", "calls", "median", "p99", "median vs ablab"):
        table.add_column(col, justify="right" if col not in ("case", "library") else "left")
    summary: dict[str, float] = {}
    for targeted in (False, True):
        case = "50/50, targeting" if targeted else "50/50, 100 % traffic"
        results = measure_case(targeted=targeted, calls=args.calls, rounds=args.rounds, overhead=overhead)
        medians = {name: statistics.median(times) for name, times in results.items()}
        for name, times in results.items():
            p99 = float(np.percentile(times, 99))
            ratio = medians[name] / medians["ablab assign"]
            table.add_row(case, name, f"{len(times):,}", fmt_ns(medians[name]), fmt_ns(p99), f"{ratio:.1f}×")
        best_gb = min(medians["GrowthBook (new instance)"], medians["GrowthBook (reused instance)"])
        summary[case] = best_gb / medians["ablab assign"]
        summary[f"{case} ablab median ns"] = medians["ablab assign"]
    console.print(table)

    rate, seconds, cpu_rate = measure_batch(args.batch, args.batch_repeat)
    checks = split_check()
    goals = Table(title="Goals")
    goals.add_column("what")
    goals.add_column("measured", justify="right")
    goals.add_column("goal", justify="right")
    goals.add_column("met")
    for case in ("50/50, 100 % traffic", "50/50, targeting"):
        median = summary[f"{case} ablab median ns"]
        goals.add_row(f"ablab median ({case})", fmt_ns(median), "≤ 2 µs", "yes" if median <= 2000 else "NO")
        goals.add_row(f"GrowthBook (faster way) / ablab ({case})", f"{summary[case]:.1f}×", "≥ 10×", "yes" if summary[case] >= 10 else "NO")
    goals.add_row(f"assign_indices, {args.batch:,} ids", f"{rate / 1e6:.2f} M/s ({seconds:.3f} s)", "≥ 2 M/s", "yes" if rate >= 2e6 else "NO")
    goals.add_row(f"assign_indices, {args.batch:,} ids, per CPU-second", f"{cpu_rate / 1e6:.2f} M/s", "≥ 2 M/s", "yes" if cpu_rate >= 2e6 else "NO")
    for name, value in checks.items():
        if "share" in name:
            goals.add_row(name, f"{value:.4f}", "0.5 ± 0.005", "yes" if abs(value - 0.5) < 0.005 else "NO")
        else:
            goals.add_row(name, "yes" if value == 1.0 else "no", "yes", "yes" if value == 1.0 else "NO")
    console.print(goals)


if __name__ == "__main__":
    main()
