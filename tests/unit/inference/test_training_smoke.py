"""`ablab train` in miniature: a few steps, fixed seeds → identical files twice, loadable."""

from ablab.inference.assets import load_bundle
from ablab.inference.training import TrainConfig, train_all

TINY = TrainConfig(
    batch_size=4, base_steps=3, adapter_steps=2, predictor_steps=2, predictor_rank=4,
    model={"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "max_len": 64},
)


def test_training_is_reproducible_and_loadable(tmp_path):
    seen = []
    a = train_all(TINY, out_dir=tmp_path / "a", progress=lambda *args: seen.append(args[0]))
    b = train_all(TINY, out_dir=tmp_path / "b")
    assert a["digests"] == b["digests"]
    assert {"base", "lora:ledger", "lora:mirror", "lora:codebook", "predictor:0", "predictor:1"} <= set(seen)
    bundle = load_bundle(tmp_path / "a")
    assert bundle.model.cfg.d_ff == 64 and set(bundle.adapters) == {"ledger", "mirror", "codebook"}
    # the adapters were trained: B moved away from its zero start
    assert any(float(v.abs().sum()) > 0 for k, v in bundle.adapters["ledger"]["layers"][0].items() if k.endswith(".b"))
