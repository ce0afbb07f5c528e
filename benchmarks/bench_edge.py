"""What the ingestion edge's checks cost, side by side with the event validation of a git revision.

Prints CPU microseconds per event (best of ``--repeat``) for, in one run and on the same events:
- ``validate_event(bytes)``: the loader's hot path, here vs ``--baseline`` (default ``main``),
  whose ``platform/events.py`` is loaded from git history (no physical bounds table, random
  ids instead of derived ones);
- ``ingest_events`` on a 1,000-event JSON body (parse, depth check, validation, derived ids,
  event-time and registry checks), into a sink that only collects.

    .venv/bin/python benchmarks/bench_edge.py [--baseline REV] [--events 1000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _events(n: int, *, with_ids: bool) -> list[dict[str, Any]]:
    ts = datetime.now(UTC).isoformat()
    return [{"v": 1, "type": "inference", "ts": ts, "trace_id": f"t{i:08d}", "experiment": "exp", "variant": "ab"[i % 2],
             "unit_id": f"u{i % 97}", "ttft_ms": 12.5, "e2e_ms": 80.0 + i % 13, "tpot_ms": 4.1, "prompt_tokens": 30,
             "output_tokens": 17, "device_s": 0.08, "cost_usd": 1e-4, "price_version": "p1", "strategy": "s1",
             **({"event_id": f"e{i:08d}"} if with_ids else {})} for i in range(n)]


def _baseline_module(rev: str) -> Any:
    source = subprocess.run(["git", "show", f"{rev}:platform/events.py"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout
    path = Path(tempfile.mkdtemp()) / "baseline_events.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("baseline_events", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["baseline_events"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _best_us_per_event(fn: Any, n: int, repeat: int) -> float:
    """Best CPU time of ``repeat`` runs (process time: steadier than wall time on a shared machine)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best / n * 1e6


class _Sink:
    def __init__(self) -> None:
        self.n = 0

    def emit(self, event: Any) -> None:
        self.n += 1

    def dead_letter(self, **_: Any) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="main", help="git revision whose events.py is the baseline")
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    from ablab.platform import events as current
    from ablab.streaming.ingest import IngestStats, ingest_events

    baseline = _baseline_module(args.baseline)
    n = args.events
    rows = []
    for label, with_ids in (("with event_id", True), ("without event_id", False)):
        raws = [json.dumps(e).encode() for e in _events(n, with_ids=with_ids)]
        assert all(not isinstance(current.validate_event(r), current.Rejection) for r in raws)
        base = here = float("inf")
        for _ in range(args.repeat):  # interleaved, so a burst of load hits both alike
            base = min(base, _best_us_per_event(lambda: [baseline.validate_event(r) for r in raws], n, 1))
            here = min(here, _best_us_per_event(lambda: [current.validate_event(r) for r in raws], n, 1))
        rows.append((f"validate_event(bytes), {label}", base, here))
    body = json.dumps({"events": _events(n, with_ids=False)}).encode()
    variants = {"exp": frozenset({"a", "b"})}
    sink = _Sink()
    ingest = _best_us_per_event(
        lambda: ingest_events(body=body, sink=sink, stats=IngestStats(), variants_of=variants.get), n, args.repeat)
    print(f"{'path':44} {args.baseline + ' us/event':>16} {'this us/event':>14} {'ratio':>7}")
    for name, base, here in rows:
        print(f"{name:44} {base:16.2f} {here:14.2f} {here / base:7.2f}")
    print(f"{'ingest_events, 1,000-event body (all checks)':44} {'':16} {ingest:14.2f}")


if __name__ == "__main__":
    main()
