"""Targeting regexes: Python's backtracking ``re`` against RE2 (what ablab runs), same run.

For each (pattern, attribute value) the time of one whole ``Condition.matches`` (attribute
lookup, type and length checks, RE2) and of a bare ``re.search`` on the same input: ordinary patterns first (what the
binding's per-call overhead costs on short values), then ``(a+)+$`` on a non-matching
value, where backtracking doubles with every character and RE2 stays linear.

Usage: .venv/bin/python benchmarks/bench_targeting.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import os
import re
import time

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ablab.platform.assignment.targeting import MAX_VALUE_CHARS, Condition, Op

console = Console(width=160)

ORDINARY = [
    (r"^pro-\d+$", "pro-42"),
    (r"(?i)^(de|fr|it)-", "FR-paris"),
    (r"enterprise|team", "x" * 200 + "team"),
    (r"^[a-z0-9._%+-]+@example\.com$", "someone.long.name@example.com"),
]


def _per_call(fn, calls: int) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    console.print(f"load average before: {os.getloadavg()}")
    table = Table("pattern", "value length", "ablab rule (RE2) µs", "bare Python re.search µs", "re / rule")
    for pattern, value in ORDINARY:
        rule, compiled, attrs = Condition("a", Op.regex, pattern), re.compile(pattern), {"a": value}
        ours = _per_call(lambda: rule.matches(attrs), args.calls)
        theirs = _per_call(lambda: compiled.search(value), args.calls)
        table.add_row(escape(pattern), str(len(value)), f"{ours:.2f}", f"{theirs:.2f}", f"{theirs / ours:.2f}")
    rule, compiled = Condition("a", Op.regex, "(a+)+$"), re.compile("(a+)+$")
    for n in (16, 20, 22, 24, MAX_VALUE_CHARS):
        value = "a" * (n - 1) + "b"
        ours = _per_call(lambda: rule.matches({"a": value}), max(1, args.calls // 10))
        if n <= 24:
            start = time.perf_counter()
            compiled.search(value)
            theirs = (time.perf_counter() - start) * 1e6
            table.add_row("(a+)+$", str(n), f"{ours:.2f}", f"{theirs:,.0f}", f"{theirs / ours:,.0f}")
        else:
            table.add_row("(a+)+$", str(n), f"{ours:.2f}", "(not run: ~2^n)", "—")
    console.print(table)
    console.print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
