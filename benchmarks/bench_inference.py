"""Strategy benchmark: one run, side by side, on whatever device is present.

    .venv/bin/python benchmarks/bench_inference.py [--device cpu|cuda|auto] [--quick] [--json OUT]

Prints markdown tables: per-strategy TTFT/TPOT/e2e/accuracy/cost at batch 1, the
batch-1 decode-step ratio of sparse vs dense FFN, goodput of the batching policies at
low and high load, and per-domain LoRA accuracy. Figures are medians/percentiles of
interleaved runs, so a noisy shared machine moves every row alike.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict

import torch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--quick", action="store_true", help="small counts (smoke run, CI)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="also write the figures as JSON here")
    ap.add_argument("--sections", default="strategies,decode,batching,lora")
    args = ap.parse_args(argv)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    torch.set_num_threads(args.threads)

    from ablab.inference import benchmark as b
    from ablab.inference.assets import shipped_bundle
    from ablab.inference.scheduler import BatchingConfig

    bundle = shipped_bundle()
    d_ff = bundle.model.cfg.d_ff
    sections = set(args.sections.split(","))
    q = args.quick
    result: dict = {"device": device, "torch": torch.__version__, "threads": args.threads, "host": platform.node()}
    print(f"# ablab inference benchmark — device {device}, torch {torch.__version__}, {args.threads} thread(s)\n")
    t_all = time.perf_counter()

    if "strategies" in sections:
        stats = b.strategy_table(bundle, device=device, n_per_row=10 if q else 60, chunk=5 if q else 6)
        print("## Strategies (batch 1, same held-out requests, all domains)\n")
        print(b.format_strategy_table(stats) + "\n")
        result["strategies"] = {k: {"n": v.n, "correct": v.correct, "error": v.error, "ttft_p50": b._pct(v.ttft, .5), "tpot_p50": b._pct(v.tpot, .5), "e2e_p50": b._pct(v.e2e, .5), "e2e_p95": b._pct(v.e2e, .95)} for k, v in stats.items()}

    if "decode" in sections:
        print("## Decode step at batch 1 (median µs per step, context 24)\n")
        print("| precision | dense | " + " | ".join(f"k={k}" for k in (d_ff // 8, d_ff // 16)) + " | speed-up k/8 | speed-up k/16 |")
        print("|---|---|---|---|---|---|")
        result["decode"] = {}
        for prec in ("fp32", "bf16", "int8"):
            if prec == "int8" and device != "cpu":
                continue
            r = b.decode_step_ratio(bundle, device=device, ks=(d_ff // 8, d_ff // 16), precision=prec, steps=50 if q else 200, rounds=2 if q else 5)
            result["decode"][prec] = r
            k8, k16 = r[f"k={d_ff // 8}"], r[f"k={d_ff // 16}"]
            print(f"| {prec} | {r['dense']:.0f} | {k8:.0f} | {k16:.0f} | {r['dense'] / k8:.2f}× | {r['dense'] / k16:.2f}× |")
        print()

    if "batching" in sections:
        base = b.load_test(bundle, device=device, batching=BatchingConfig("none", 1, 0), rate=2.0, duration_s=2 if q else 4, slo_ttft_ms=1e9, slo_tpot_ms=1e9)
        service_s = base.e2e_p50 / 1000
        slo_ttft, slo_tpot = 10 * base.ttft_p50, 3 * base.tpot_p50
        print(f"## Batching (open-loop Poisson; unloaded e2e p50 {base.e2e_p50:.1f} ms; SLO TTFT ≤ {slo_ttft:.1f} ms, TPOT ≤ {slo_tpot:.1f} ms)\n")
        print("| load | policy | rate/s | goodput/s | TTFT p50 | TTFT p95 | TPOT p50 | e2e p50 | e2e p95 |")
        print("|---|---|---|---|---|---|---|---|---|")
        policies = [BatchingConfig("none", 1, 0)] + [BatchingConfig("fixed", n, 20.0) for n in (2, 4, 8, 16)] + [BatchingConfig("adaptive", 16, 20.0)]
        result["batching"] = []
        for load, factor in (("low", 0.3), ("high", 4.0)):
            rate = factor / service_s
            for pol in policies:
                r = b.load_test(bundle, device=device, batching=pol, rate=rate, duration_s=2 if q else 6, slo_ttft_ms=slo_ttft, slo_tpot_ms=slo_tpot)
                result["batching"].append({"load": load, **asdict(r)})
                print(f"| {load} | {r.policy} | {r.rate:.0f} | {r.goodput:.1f} | {r.ttft_p50:.1f} | {r.ttft_p95:.1f} | {r.tpot_p50:.2f} | {r.e2e_p50:.1f} | {r.e2e_p95:.1f} |")
        print()

    if "lora" in sections:
        t = b.lora_table(bundle, device=device, n=40 if q else 200)
        result["lora"] = t
        print("## LoRA adapters (held-out accuracy on each adapter's domain)\n")
        print("| domain | base | adapter | gain (points) |")
        print("|---|---|---|---|")
        for dom, (base_acc, ad_acc) in t.items():
            print(f"| {dom} | {base_acc:.1%} | {ad_acc:.1%} | {100 * (ad_acc - base_acc):+.1f} |")
        print()

    result["wall_s"] = time.perf_counter() - t_all
    print(f"_total {result['wall_s']:.0f} s_")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
