"""The paired analysis of shadow requests (issue 34): the tests equal scipy's on the same pairs
to 1e-6 (``ttest_rel`` and its interval, ``binomtest`` as the sign test, ``wilcoxon`` with its
defaults, every branch of its method choice), and ``ablab analyze`` pairs each shadow with its
own primary: failed shadows out of latencies but in the error rate and the coverage, dropped
shadows counted, a shadow graded by its own trace id, custom metrics where they are per request.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from ablab.platform.analytics.schemas import Results
from ablab.platform.stats.offline import analyze_events
from ablab.platform.stats.paired import paired_t, shadow_metrics, sign_test, wilcoxon_signed_rank
from ablab.platform.stats.spec import parse_spec


def _pairs(rng, n: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    primary = rng.lognormal(5.5, 0.6, n)
    shadow = primary * rng.lognormal(0.08, 0.3, n)
    if kind == "ties":  # latencies reported in whole 50 ms steps: tied |differences|
        primary, shadow = np.round(primary / 50) * 50, np.round(shadow / 50) * 50
    elif kind == "zeros":  # some shadows exactly as fast as their primary
        shadow[: max(1, n // 4)] = primary[: max(1, n // 4)]
    elif kind == "counts":  # small integers (tokens, 0/1 grades): ties and zeros everywhere
        primary, shadow = rng.integers(0, 4, n).astype(float), rng.integers(0, 4, n).astype(float)
    return primary, shadow


# every branch of scipy's method choice: exact (≤ 50 pairs, no ties or zeros), the exact sign-flip
# permutation (≤ 13 pairs with ties or zeros; scipy takes seconds there, so one seed), normal
CASES = [(n, kind, seed) for n in (2, 3, 6, 12, 13, 14, 30, 50, 51, 80, 400, 5000)
         for kind in ("continuous", "ties", "zeros", "counts") for seed in range(1 if n in (12, 13) else 3)]


@pytest.mark.parametrize(("n", "kind", "seed"), CASES)
def test_paired_tests_equal_scipy_on_the_same_pairs(n, kind, seed):
    primary, shadow = _pairs(np.random.default_rng(1000 * n + seed), n, kind)
    d = shadow - primary
    if not (d != 0).any():
        pytest.skip("no non-zero difference: no rank test")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = stats.ttest_rel(shadow, primary)
        ref_ci = ref.confidence_interval(confidence_level=0.9)
        ref_w = stats.wilcoxon(shadow, primary)
    ours = paired_t(d, alpha=0.1)
    if np.isfinite(ref.pvalue):
        assert ours.p_value == pytest.approx(ref.pvalue, abs=1e-6, rel=1e-6)
        assert ours.ci == pytest.approx((ref_ci.low, ref_ci.high), abs=1e-6, rel=1e-9)
    else:
        assert np.isnan(ours.p_value)
    assert ours.mean == pytest.approx(float(np.mean(d)), rel=1e-12)
    k, m = int((d > 0).sum()), int((d != 0).sum())
    assert sign_test(d) == pytest.approx(stats.binomtest(k, m, 0.5).pvalue, abs=1e-6)
    assert wilcoxon_signed_rank(d) == pytest.approx(ref_w.pvalue, abs=1e-6)


def test_degenerate_pairs_give_no_p_value():
    empty = paired_t(np.array([]))
    assert empty.n == 0 and np.isnan(empty.mean) and np.isnan(empty.p_value)
    one = paired_t(np.array([3.0]))
    assert one.n == 1 and one.mean == 3.0 and np.isnan(one.p_value) and np.isnan(one.ci[0])
    flat = paired_t(np.array([2.0, 2.0, 2.0]))  # every pair moved by the same amount (scipy: p = 0)
    assert flat.ci == (2.0, 2.0) and flat.p_value == 0.0
    assert np.isnan(paired_t(np.zeros(4)).p_value)
    assert np.isnan(sign_test(np.zeros(5))) and np.isnan(wilcoxon_signed_rank(np.zeros(5)))


# ---------------------------------------------------------------- ablab analyze pairs shadows


BASE = {"type": "inference", "experiment": "x", "price_version": "p", "strategy": "s", "device_s": 0.1}


def _events(seed: int = 4, n: int = 400) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        variant = "t" if i % 2 else "c"
        ts = pd.Timestamp("2026-12-01T00:00:00Z") + pd.Timedelta(milliseconds=100 * i)
        e2e = float(rng.lognormal(6, 0.5))
        ttft = e2e * 0.2
        out = int(rng.integers(2, 100))
        shadow = ("sent" if i % 5 else "dropped") if i % 3 == 0 else None
        rows.append({**BASE, "trace_id": f"p{i}", "variant": variant, "unit_id": f"u{i % 37}", "ts": ts,
                     "e2e_ms": e2e, "ttft_ms": ttft, "tpot_ms": (e2e - ttft) / (out - 1), "prompt_tokens": 50,
                     "output_tokens": out, "cost_usd": 1e-5 * out, "shadow": shadow,
                     "measures": {"tool_calls": float(rng.integers(0, 3))}})
        if rng.random() < 0.7:
            rows.append({"type": "feedback", "trace_id": f"p{i}", "ts": ts + pd.Timedelta(seconds=9),
                         "correct": float(rng.random() < 0.5), "source": "judge",
                         **({"score": float(rng.uniform(0, 1))} if rng.random() < 0.6 else {})})
        if shadow != "sent":
            continue
        slow = float(rng.lognormal(0.2 if variant == "t" else 0.0, 0.2))
        s_out = max(2, out + int(rng.integers(-5, 6)))
        failed = i % 7 == 0
        rows.append({**BASE, "trace_id": f"s{i}", "variant": variant, "unit_id": f"u{i % 37}",
                     "ts": ts + pd.Timedelta(milliseconds=3), "e2e_ms": 30_000.0 if failed else e2e * slow,
                     "ttft_ms": 30_000.0 if failed else ttft * slow,
                     "tpot_ms": None if failed else (e2e * slow - ttft * slow) / (s_out - 1),
                     "prompt_tokens": 50, "output_tokens": 0 if failed else s_out, "cost_usd": 1e-5 * s_out,
                     "shadow_of": f"p{i}", "error": "timeout" if failed else None,
                     "measures": {"tool_calls": float(rng.integers(0, 4))}})
        if rng.random() < 0.8:  # graded by the shadow's own trace id
            rows.append({"type": "feedback", "trace_id": f"s{i}", "ts": ts + pd.Timedelta(seconds=10),
                         "correct": float(rng.random() < 0.8), "score": float(rng.uniform(0, 1)), "source": "judge"})
    return pd.DataFrame(rows)


SPEC = {"key": "x", "control": "c", "variants": [{"key": "c"}, {"key": "t"}], "slos": {"ttft_ms": 200},
        "metrics": {"custom": [
            {"name": "tools", "type": "mean", "column": "measures.tool_calls"},
            {"name": "failed", "type": "proportion", "column": "error"},
            {"name": "per_token", "type": "ratio", "numerator": "cost_usd", "denominator": "output_tokens"},
            {"name": "ttft_p90", "type": "quantile", "column": "ttft_ms", "quantile": 0.9},
        ]}}


def _by_hand(ev: pd.DataFrame, variant: str, column: str, *, success_only: bool) -> tuple[np.ndarray, np.ndarray]:
    inf = ev[ev["type"] == "inference"].set_index("trace_id")
    labels = ev[ev["type"] == "feedback"].set_index("trace_id")
    shadows = inf[inf["shadow_of"].notna() & (inf["variant"] == variant)]
    primary, shadow = [], []
    for trace, s in shadows.iterrows():
        p = inf.loc[s["shadow_of"]]
        if success_only and (isinstance(s["error"], str) or isinstance(p["error"], str)):
            continue
        if column in ("correct", "score"):
            if trace not in labels.index or s["shadow_of"] not in labels.index:
                continue
            pv, sv = labels.loc[s["shadow_of"], column], labels.loc[trace, column]
        elif column == "tool_calls":
            pv, sv = p["measures"]["tool_calls"], s["measures"]["tool_calls"]
        elif column == "error":
            pv, sv = float(isinstance(p["error"], str)), float(isinstance(s["error"], str))
        else:
            pv, sv = p[column], s[column]
        if pd.isna(pv) or pd.isna(sv):
            continue
        primary.append(float(pv))
        shadow.append(float(sv))
    return np.array(primary), np.array(shadow)


def test_analyze_pairs_each_shadow_with_its_primary_and_equals_scipy():
    ev = _events()
    result, _ = analyze_events(ev, parse_spec(SPEC))
    result = result.model_dump(mode="json")
    rows = {(r["variant"], r["metric"]): r for r in result["shadows"]}
    assert Results.model_validate(result).shadows[0].coverage.requests == 200  # the typed model reads them
    names = [m.name for m in shadow_metrics(parse_spec(SPEC))]
    assert names == ["e2e_ms", "ttft_ms", "tpot_ms", "cost_usd", "prompt_tokens", "output_tokens", "accuracy", "score",
                     "error_rate", "goodput", "tools", "failed"]  # no ratio, no quantile
    checks = [("e2e_ms", "e2e_ms", True), ("ttft_ms", "ttft_ms", True), ("tpot_ms", "tpot_ms", True),
              ("output_tokens", "output_tokens", True), ("cost_usd", "cost_usd", True), ("accuracy", "correct", False),
              ("score", "score", False), ("error_rate", "error", False), ("tools", "tool_calls", True),
              ("failed", "error", False)]
    for variant in ("c", "t"):
        for metric, column, success_only in checks:
            primary, shadow = _by_hand(ev, variant, column, success_only=success_only)
            row = rows[(variant, metric)]
            assert row["n_pairs"] == len(primary) > 10, (variant, metric)
            ref = stats.ttest_rel(shadow, primary)
            ci = ref.confidence_interval(confidence_level=0.95)
            assert row["mean_diff"] == pytest.approx(float(np.mean(shadow - primary)), rel=1e-9, abs=1e-12)
            assert row["primary_mean"] == pytest.approx(float(np.mean(primary)), rel=1e-9)
            assert row["shadow_mean"] == pytest.approx(float(np.mean(shadow)), rel=1e-9)
            assert row["p_value"] == pytest.approx(ref.pvalue, abs=1e-6), (variant, metric)
            assert row["ci"] == pytest.approx([ci.low, ci.high], abs=1e-6, rel=1e-9)
            if metric in ("e2e_ms", "ttft_ms", "tpot_ms"):
                d = shadow - primary
                assert row["wilcoxon_p_value"] == pytest.approx(stats.wilcoxon(shadow, primary).pvalue, abs=1e-6)
                assert row["sign_p_value"] == pytest.approx(
                    stats.binomtest(int((d > 0).sum()), int((d != 0).sum())).pvalue, abs=1e-6)
            else:
                assert row["wilcoxon_p_value"] is None and row["sign_p_value"] is None
    # t's shadows are slower; the failed ones (30 s timeouts) are not in the latencies
    assert rows[("t", "e2e_ms")]["mean_diff"] > 0 and rows[("t", "e2e_ms")]["wilcoxon_p_value"] < 1e-3
    assert rows[("t", "e2e_ms")]["shadow_mean"] < 5_000
    inf = ev[ev["type"] == "inference"]
    for variant in ("c", "t"):
        mine = inf[(inf["variant"] == variant)]
        primaries, shadows = mine[mine["shadow_of"].isna()], mine[mine["shadow_of"].notna()]
        assert rows[(variant, "e2e_ms")]["coverage"] == {
            "requests": len(primaries), "chosen": int(primaries["shadow"].notna().sum()),
            "sent": int((primaries["shadow"] == "sent").sum()), "dropped": int((primaries["shadow"] == "dropped").sum()),
            "shadowed": len(shadows), "failed": int(shadows["error"].notna().sum()), "orphaned": 0,
        }
    # p-values corrected across the shadow rows (Holm: never below the raw ones)
    assert all(r["p_value_adjusted"] >= r["p_value"] for r in result["shadows"] if r["p_value"] is not None)
    # the shadows' own labels are not orphan feedback; the variants' numbers ignore the shadows
    assert result["data_quality"]["orphan_feedback"] == 0
    plain, _ = analyze_events(ev[ev["shadow_of"].isna() & ~ev["trace_id"].str.startswith("s")], parse_spec(SPEC))
    plain = plain.model_dump(mode="json")
    assert [(r["metric"], r["variant"], r["estimate"]) for r in result["metrics"]] == \
        [(r["metric"], r["variant"], r["estimate"]) for r in plain["metrics"]]


def test_a_graded_shadow_shows_as_the_shadows_accuracy():
    """Feedback posted for the shadow's own trace id is the shadow side of the accuracy pair
    (the latest label wins, as for any request)."""
    t0 = pd.Timestamp("2026-12-01T00:00:00Z")
    rows = []
    for i in range(6):
        rows.append({**BASE, "trace_id": f"p{i}", "variant": "c", "unit_id": f"u{i}", "ts": t0, "e2e_ms": 100.0,
                     "ttft_ms": 10.0, "cost_usd": 0.0, "shadow": "sent"})
        rows.append({**BASE, "trace_id": f"s{i}", "variant": "c", "unit_id": f"u{i}", "ts": t0, "e2e_ms": 120.0,
                     "ttft_ms": 12.0, "cost_usd": 0.0, "shadow_of": f"p{i}"})
        rows.append({"type": "feedback", "trace_id": f"p{i}", "ts": t0, "correct": 0.0, "source": "judge"})
        rows.append({"type": "feedback", "trace_id": f"s{i}", "ts": t0, "correct": 0.0, "source": "judge"})
    for i in range(4):  # relabelled later: four of the six shadows were right
        rows.append({"type": "feedback", "trace_id": f"s{i}", "ts": t0 + pd.Timedelta(minutes=5), "correct": 1.0,
                     "source": "human"})
    result, _ = analyze_events(pd.DataFrame(rows), parse_spec({**SPEC, "metrics": None}))
    result = result.model_dump(mode="json")
    acc = next(r for r in result["shadows"] if r["metric"] == "accuracy")
    assert (acc["n_pairs"], acc["primary_mean"], acc["shadow_mean"]) == (6, 0.0, pytest.approx(4 / 6))
    assert acc["mean_diff"] == pytest.approx(4 / 6)
    variant_acc = next(r for r in result["metrics"] if r["metric"] == "accuracy" and r["variant"] == "c")
    assert variant_acc["estimate"] == 0.0  # the primaries' own labels; the shadow is not the variant's request


def test_shadows_appear_only_with_shadow_activity_and_count_drops_and_orphans():
    t0 = pd.Timestamp("2026-12-01T00:00:00Z")
    req = {**BASE, "variant": "c", "unit_id": "u", "ts": t0, "e2e_ms": 100.0, "ttft_ms": 10.0, "cost_usd": 0.0}
    spec = parse_spec({"key": "x", "control": "c", "variants": [{"key": "c"}, {"key": "t"}]})
    none, _ = analyze_events(pd.DataFrame([{**req, "trace_id": "a"}]), spec)
    none = none.model_dump(mode="json")
    assert "shadows" not in none
    dropped, _ = analyze_events(pd.DataFrame([{**req, "trace_id": "a", "shadow": "dropped"},
                                              {**req, "trace_id": "b"},
                                              {**req, "trace_id": "o", "shadow_of": "gone"}]), spec)
    dropped = dropped.model_dump(mode="json")
    assert {r["variant"] for r in dropped["shadows"]} == {"c"}  # t had no shadow activity
    assert dropped["shadows"][0]["coverage"] == {"requests": 2, "chosen": 1, "sent": 0, "dropped": 1, "shadowed": 0,
                                                 "failed": 0, "orphaned": 1}
    assert all(r["n_pairs"] == 0 and r["p_value"] is None for r in dropped["shadows"])


def test_a_shadow_is_validated_as_any_request():
    t0 = pd.Timestamp("2026-12-01T00:00:00Z")
    req = {**BASE, "variant": "c", "unit_id": "u", "ts": t0, "e2e_ms": 100.0, "ttft_ms": 10.0, "cost_usd": 0.0}
    spec = parse_spec({"key": "x", "control": "c", "variants": [{"key": "c"}, {"key": "t"}]})
    ev = pd.DataFrame([{**req, "trace_id": "a", "shadow": "sent"},
                       {**req, "trace_id": "s1", "shadow_of": "a", "e2e_ms": -1.0},
                       {**req, "trace_id": "s2", "shadow_of": "a", "variant": "nope"},
                       {**req, "trace_id": "s3", "shadow_of": "a", "ttft_ms": 500.0}])
    result, _ = analyze_events(ev, spec)
    result = result.model_dump(mode="json")
    assert result["data_quality"]["rejected"] == {"negative_latency": 1, "unknown_variant": 1, "ttft_exceeds_e2e": 1}
    assert result["shadows"][0]["coverage"]["shadowed"] == 0


def test_terminal_table_shows_the_shadows():
    from rich.console import Console

    from ablab.platform.stats.render import rich_tables

    result, _ = analyze_events(_events(n=60), parse_spec(SPEC))
    result = result.model_dump(mode="json")
    console = Console(width=240, record=True)
    for table in rich_tables(result):
        console.print(table)
    text = console.export_text()
    assert "shadows (each against its own primary" in text and "p Wilcoxon" in text and "dropped" in text
