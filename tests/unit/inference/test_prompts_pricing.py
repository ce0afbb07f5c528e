from datetime import UTC, datetime

import pytest

from ablab.inference import prompts, tasks
from ablab.inference.tokenizer import build_tokenizer
from ablab.platform.pricing import load_price_table, parse_price_table


def test_templates_and_unknown_template():
    assert prompts.apply_template("1+2=", domain="arith", template="plain") == "1+2="
    assert prompts.apply_template("1+2=", domain="arith", template="structured") == "ad|1+2="
    with pytest.raises(ValueError, match="prompt_template"):
        prompts.apply_template("1+2=", domain="arith", template="nope")


def test_entropy_pruning_drops_predictable_tokens_and_keeps_the_trigger():
    ids = list(range(10))
    s = [1.0, 0.05, 0.9, 0.1, 0.5, 0.01, 0.02, 0.03, 0.04, 0.0]
    kept = prompts.prune_by_entropy(ids, s, tau=0.2, window=4)
    assert kept == [0, 2, 4, 8, 9]  # BOS, the surprising ones, the best of an all-low window, the last token
    assert prompts.prune_by_entropy(ids, s, tau=0.0, window=4) == ids


def test_confidence_is_geometric_mean_probability():
    import math

    assert prompts.confidence([math.log(0.5), math.log(0.5)]) == pytest.approx(0.5)
    assert prompts.confidence([]) == 1.0


def test_tasks_heldout_is_disjoint_and_graded():
    for d in tasks.DOMAINS:
        held = tasks.heldout_set(d, 50)
        assert all(tasks.is_heldout(e.text) for e in held)
        import random

        rng = random.Random(0)
        assert not any(tasks.is_heldout(tasks.sample(d, rng).text) for _ in range(200))
        assert all(tasks.grade(e, e.answer) for e in held)
    ex = tasks.Example("codebook", "a=37;a#", "dh")
    assert tasks.grade(ex, "dh") and not tasks.grade(ex, "37")


def test_tokenizer_round_trip_and_unknown_characters():
    tok = build_tokenizer()
    ids = tok.encode("sb|73-25=..")
    assert tok.decode(ids) == "sb|73-25=.."
    with pytest.raises(ValueError, match="prompt"):
        tok.encode("ÄÖ")


def test_price_table_versions_by_effective_date():
    table = load_price_table()
    cost, version = table.cost(device_s=3600.0, device="cpu", when=datetime(2026, 3, 1, tzinfo=UTC))
    assert version == "2026-01" and cost == pytest.approx(0.096)
    cost, version = table.cost(device_s=1.0, device="cuda", when=datetime(2026, 8, 1, tzinfo=UTC))
    assert version == "2026-07" and cost == pytest.approx(3.50 / 3600)
    with pytest.raises(LookupError):
        table.at(datetime(2020, 1, 1, tzinfo=UTC))
    with pytest.raises(ValueError, match="effective_from"):
        parse_price_table({"versions": [{"version": "x", "per_device_hour": {}}]})
