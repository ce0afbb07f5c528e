"""Load shedding under overload: the group admission against the queue-only limit, paired.

    .venv/bin/python benchmarks/bench_shedding.py --rates 700,1050 --pairs 4 [--workload task]

The adaptive policy with ``shed_late`` prefills a group in one step when nothing runs. That
group is chosen by ``Scheduler.group_admission`` (its predicted step time counted against
every member's TTFT SLO, freshest first). The ablation ("queue-only") takes the group first
come, first served and relies on the queue-only shed limit alone. Both run on the
same Poisson traces, alternating, so a shared machine's drift hits both alike. Prints per
run the requests that met both SLOs, missed TTFT, missed TPOT, or were refused, and the
paired ratio of good requests.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import _path  # noqa: F401 - tests/ on the import path: the benchmarks share ablab_testing
import torch

from ablab.inference.assets import shipped_bundle
from ablab.inference.engine import Engine
from ablab.inference.scheduler import BatchingConfig
from ablab_testing import inference_bench as b

INF = float("inf")


def _queue_only(self: Engine, room: int, now: float) -> list:
    """The ablation: the oldest `room` requests, with no group admission."""
    return [self.waiting.popleft() for _ in range(room)]


def outcome(run: b.LoadRun, slo_ttft_ms: float, slo_tpot_ms: float) -> dict[str, int]:
    counts = {"good": 0, "late TTFT": 0, "late TPOT only": 0, "refused/unfinished": 0}
    for ttft, tpot, e2e in run.requests:
        if e2e == INF:
            counts["refused/unfinished"] += 1
        elif b.meets_slo(ttft, tpot, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms):
            counts["good"] += 1
        elif ttft > slo_ttft_ms:
            counts["late TTFT"] += 1
        else:
            counts["late TPOT only"] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="700,1050", help="arrival rates/s, comma-separated")
    ap.add_argument("--pairs", type=int, default=4, help="paired runs per rate")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds of arrivals per run")
    ap.add_argument("--slo", default="20.4,4.6", help="TTFT_MS,TPOT_MS (the batching runs' fixed task SLOs)")
    ap.add_argument("--workload", default="task", choices=b.WORKLOADS)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    slo_ttft, slo_tpot = (float(x) for x in args.slo.split(","))
    bundle = shipped_bundle()
    policy = BatchingConfig("adaptive", 16, 20.0, tpot_slo_ms=slo_tpot, ttft_slo_ms=slo_ttft, shed_late=True)
    group = Engine._feasible_group
    print(f"# Shedding under overload, {args.workload} workload, SLO TTFT ≤ {slo_ttft:g} ms, TPOT ≤ {slo_tpot:g} ms\n")
    print("| rate/s | pair | admission | good | late TTFT | late TPOT only | refused/unfinished |")
    print("|---|---|---|---|---|---|---|")
    for rate in (float(r) for r in args.rates.split(",")):
        ratios = []
        for pair in range(args.pairs):
            trace = b.poisson_trace(bundle, rate=rate, duration_s=args.duration, seed=50 + pair, workload=args.workload)
            good = {}
            for name, impl in (("group", group), ("queue-only", _queue_only))[:: 1 if pair % 2 == 0 else -1]:
                Engine._feasible_group = impl
                try:
                    run = b.run_trace(bundle, device="cpu", batching=policy, trace=trace, duration_s=args.duration)
                finally:
                    Engine._feasible_group = group
                c = outcome(run, slo_ttft, slo_tpot)
                good[name] = c["good"]
                print(f"| {rate:.0f} | {pair + 1} | {name} | " + " | ".join(str(v) for v in c.values()) + " |", flush=True)
            ratios.append(good["group"] / max(good["queue-only"], 1))
        print(f"| {rate:.0f} | | **good, group / queue-only: median {statistics.median(ratios):.2f}×** "
              f"(pairs {', '.join(f'{r:.2f}' for r in ratios)}) | | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
