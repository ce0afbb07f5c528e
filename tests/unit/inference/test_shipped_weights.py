"""The committed weights load, and reach the accuracy their manifest states (held-out)."""

import pytest

from ablab.inference import tasks
from ablab.inference.assets import shipped_bundle
from ablab.inference.evaluate import accuracy

N = 80  # the manifest's figures use 200; 80 keeps the suite fast, hence the tolerance
TOLERANCE = 0.08


@pytest.fixture(scope="module")
def bundle():
    return shipped_bundle()


def test_shipped_files_are_small_and_complete(bundle):
    from ablab.inference.tokenizer import ASSETS

    total = sum(p.stat().st_size for p in ASSETS.rglob("*") if p.is_file())
    assert total < 8 * 1024 * 1024
    assert set(bundle.adapter_domains) == set(tasks.ADAPTER_DOMAINS)
    assert bundle.manifest["heldout_accuracy"]


GOAL_BASE = 0.80  # the accuracy the issue asks of the base tasks, so the columns mean something


# what the shipped base states (manifest, n = 200) at least: arith 97.0 %, lookup 20.5 %
FLOOR = {"arith": 0.90, "lookup": 0.20}


@pytest.mark.parametrize("domain", tasks.BASE_DOMAINS)
def test_base_reaches_its_stated_accuracy(bundle, domain):
    stated = bundle.manifest["heldout_accuracy"][domain]["base"]
    assert stated >= FLOOR[domain]  # a retrain that regresses fails here, not silently
    assert accuracy(bundle, domain=domain, n=N) >= stated - TOLERANCE


# The base domains the shipped weights leave below the goal. lookup: the retrieval circuit
# (match the query key, copy the value after it) did not form in any recipe tried; see
# docs/benchmarks/inference.md. A retrain that moves a domain across the goal changes this.
BELOW_GOAL = {"lookup"}


def test_the_manifest_says_which_base_domains_miss_the_goal(bundle):
    stated = bundle.manifest["heldout_accuracy"]
    assert {d for d in tasks.BASE_DOMAINS if stated[d]["base"] < GOAL_BASE} == BELOW_GOAL


@pytest.mark.parametrize("domain", [d for d in tasks.BASE_DOMAINS if d not in BELOW_GOAL])
def test_base_reaches_the_issue_goal(bundle, domain):
    assert accuracy(bundle, domain=domain, n=N) >= GOAL_BASE - TOLERANCE


@pytest.mark.parametrize("domain", tasks.ADAPTER_DOMAINS)
def test_each_adapter_beats_the_base_on_its_domain(bundle, domain):
    stated = bundle.manifest["heldout_accuracy"][domain]
    base = accuracy(bundle, domain=domain, n=N)
    tuned = accuracy(bundle, domain=domain, adapter=bundle.adapter_domains[domain], n=N)
    assert tuned >= stated["adapter"] - TOLERANCE
    assert stated["adapter"] - stated["base"] >= 0.10  # the issue's goal, as the manifest states it
    assert tuned >= base + 0.10  # and as measured here on held-out data


# k = 192 (1/16 of d_ff): the largest k that keeps arith within the bound (calibrated:
# 1.73x at batch 1 on a quiet run, 97.9 vs 97.4 % at n = 1000; k = 128 is -2.6 points,
# docs/benchmarks/inference.md)
SPARSE_K = 192


def test_sparse_decode_keeps_arith_within_two_points_of_dense(bundle):
    """The issue's accuracy bound for sparse FFN decode, on the full held-out figure (n = 200):
    the activation-sparsity phase of training is what makes top-k selection lose little."""
    from ablab.inference.runtime.executor import RuntimeConfig

    dense = accuracy(bundle, domain="arith", n=200)
    sparse = accuracy(bundle, domain="arith", runtime=RuntimeConfig(sparse_ffn_k=SPARSE_K), n=200)
    assert sparse >= dense - 0.02, (dense, sparse)


def test_neuron_calibration_reproduces_from_the_shipped_weights(bundle):
    """`calibrate_neurons` on the shipped base gives the shipped live sets and caps (bit for
    bit on the machine that made them; another CPU's float rounding may flip a neuron that
    sits at zero, hence the tolerance on the set, not on the cap)."""
    import torch

    from ablab.inference.training import TrainConfig, calibrate_neurons

    torch.set_num_threads(1)
    got = calibrate_neurons(bundle.model, TrainConfig(), bundle.tokenizer)
    for pred, (neurons, cap) in zip(bundle.predictors, got):
        shipped, now = set(pred.neurons.tolist()), set(neurons.tolist())
        assert len(shipped ^ now) <= len(shipped) // 100 and pred.cap == cap
        assert cap % 32 == 0 and len(now) == len(neurons)
    layer1 = bundle.manifest["calibration"]["layer1"]
    assert layer1["live"] < bundle.model.cfg.d_ff // 2  # most of layer 1 never fires: what the restriction saves
