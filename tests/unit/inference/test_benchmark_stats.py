"""The batching benchmark's comparison arithmetic (pure: LoadRuns in, ratios out)."""

import random
import statistics

import pytest

from ablab_testing.inference_bench import LoadRun, crossfit_ratio

SLO = {"slo_ttft_ms": 100.0, "slo_tpot_ms": 10.0}


def _run(e2e: list[float]) -> LoadRun:
    return LoadRun(1.0, [(1.0, 1.0, x) for x in e2e])


def test_crossfit_chooses_on_one_fold_and_compares_on_the_other():
    # "lucky" is best on the even runs only, "steady" is best on the odd ones: each fold's
    # pick is compared on the other fold, where it is not the best
    runs = {
        "cand": [_run([10.0] * 20), _run([10.0] * 20)],
        "lucky": [_run([5.0] * 20), _run([20.0] * 20)],
        "steady": [_run([8.0] * 20), _run([8.0] * 20)],
    }
    ratio, chosen = crossfit_ratio(runs, candidate="cand", pool=["lucky", "steady"], metric="e2e_p95", **SLO)
    assert chosen == ["lucky", "steady"]
    # even fold picks lucky, compared on odd: 10/20; odd fold picks steady, compared on even: 10/8
    assert ratio == pytest.approx((10 / 20 * 10 / 8) ** 0.5)


def test_crossfit_removes_the_winners_curse_that_same_run_selection_has():
    # seven policies drawn from one distribution: choosing the lowest p95 on the same runs
    # makes an equal candidate look worse; choosing on the other fold does not
    rng = random.Random(7)
    naive, fitted = [], []
    for _ in range(60):
        runs = {name: [_run([rng.lognormvariate(3, 0.6) for _ in range(40)]) for _ in range(4)] for name in ["cand", *"abcdefg"]}
        pool = list("abcdefg")
        fitted.append(crossfit_ratio(runs, candidate="cand", pool=pool, metric="e2e_p95", **SLO)[0])
        pooled = {n: sorted(x for run in rs for _, _, x in run.requests) for n, rs in runs.items()}
        p95 = {n: xs[int(0.95 * (len(xs) - 1))] for n, xs in pooled.items()}
        naive.append(p95["cand"] / min(p95[n] for n in pool))
    assert statistics.median(naive) > 1.08  # the bias the cross-fit exists for
    assert 0.93 < statistics.median(fitted) < 1.07


def test_crossfit_goodput_picks_the_highest_and_counts_only_slo_meeting_requests():
    fast = LoadRun(1.0, [(50.0, 5.0, 60.0)] * 10)
    late = LoadRun(1.0, [(500.0, 5.0, 600.0)] * 10)  # every request past the TTFT SLO
    runs = {"cand": [fast, fast], "a": [late, late], "b": [LoadRun(1.0, fast.requests[:5]), LoadRun(1.0, fast.requests[:5])]}
    ratio, chosen = crossfit_ratio(runs, candidate="cand", pool=["a", "b"], metric="goodput", **SLO)
    assert chosen == ["b", "b"]
    assert ratio == pytest.approx(2.0)


def test_crossfit_rejects_a_single_run_and_an_unknown_metric():
    runs = {"cand": [_run([1.0])], "a": [_run([1.0])]}
    with pytest.raises(ValueError, match="at least 2 runs"):
        crossfit_ratio(runs, candidate="cand", pool=["a"], metric="e2e_p95", **SLO)
    with pytest.raises(ValueError, match="metric"):
        crossfit_ratio(runs, candidate="cand", pool=["a"], metric="ttft", **SLO)
