"""An experiment whose weights the allocator moved has no fixed split: the SRM check is skipped,
said so in the output, and does not block the decision; otherwise it still flags."""

from dataclasses import replace

from ablab.platform.stats.offline import analyze_events
from ablab.platform.stats.spec import parse_spec
from ablab.platform.stats.synthetic import VariantEffect, spec_dict, synthetic_events


def test_adaptive_experiments_skip_the_sample_ratio_check():
    # traffic really split 80/20 (as after a re-weight) while the configuration says 50/50
    truth = {"control": VariantEffect(weight=0.8), "b": VariantEffect(weight=0.2)}
    events = synthetic_events(variants=truth, n_requests=4000, n_units=4000, unit="request", seed=4)
    configured = parse_spec(spec_dict({"control": VariantEffect(weight=0.5), "b": VariantEffect(weight=0.5)}, unit="request"))
    fixed, _ = analyze_events(events, configured)
    fixed = fixed.model_dump(mode="json")
    assert fixed["srm"]["flagged"] is True and fixed["srm"]["skipped"] is None
    assert any("sample ratio mismatch" in r for d in fixed["decisions"] for r in d.get("reasons", []))
    adaptive, _ = analyze_events(events, replace(configured, adaptive=True))
    adaptive = adaptive.model_dump(mode="json")
    assert adaptive["srm"]["flagged"] is False and adaptive["srm"]["p_value"] is None
    assert "adaptive" in adaptive["srm"]["skipped"]
    assert not any("sample ratio mismatch" in r for d in adaptive["decisions"] for r in d.get("reasons", []))
