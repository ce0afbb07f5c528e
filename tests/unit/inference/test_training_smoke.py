"""`ablab train` in miniature: a few steps, fixed seeds → identical files twice, loadable."""

from ablab.inference.assets import load_bundle
from ablab.inference.training import TrainConfig, train_all

TINY = TrainConfig(
    batch_size=4, base_steps=3, sparsify_steps=2, adapter_steps=2, predictor_steps=2, predictor_rank=4,
    model={"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "max_len": 64},
)


def test_training_is_reproducible_and_loadable(tmp_path):
    seen = []
    a = train_all(TINY, out_dir=tmp_path / "a", progress=lambda *args: seen.append(args[0]))
    b = train_all(TINY, out_dir=tmp_path / "b")
    assert a["digests"] == b["digests"]
    assert {"base", "sparsify", "lora:ledger", "lora:mirror", "lora:codebook", "predictor:0", "predictor:1"} <= set(seen)
    bundle = load_bundle(tmp_path / "a")
    assert bundle.model.cfg.d_ff == 64 and set(bundle.adapters) == {"ledger", "mirror", "codebook"}
    # the adapters were trained: B moved away from its zero start
    assert any(float(v.abs().sum()) > 0 for k, v in bundle.adapters["ledger"]["layers"][0].items() if k.endswith(".b"))


def test_selected_logits_equal_the_full_forward_at_the_answer_positions():
    """Training runs the last FFN on answer positions only; it must be the same function."""
    import random

    import torch

    from ablab.inference import tasks
    from ablab.inference.model.lora import init_adapter
    from ablab.inference.model.transformer import ModelConfig, TinyLM
    from ablab.inference.tokenizer import build_tokenizer
    from ablab.inference.training import _lora_layers, make_batch

    tok = build_tokenizer()
    rng = random.Random(3)
    torch.manual_seed(3)
    model = TinyLM(ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_layers=2, d_ff=64))
    x, _, mask = make_batch([tasks.sample(d, rng) for d in tasks.DOMAINS for _ in range(3)], rng, tok)
    assert torch.allclose(model.selected_logits(x, mask), model(x)[mask], atol=1e-6)
    params = init_adapter(n_layers=2, d_model=32, d_ff=64, rank=4, seed=1)
    for layer in params:
        for name, v in layer.items():
            if name.endswith(".b"):
                v.normal_()  # B = 0 would make the adapter a no-op and the check vacuous
    lora = _lora_layers(params, 2.0)
    assert not torch.allclose(model(x, lora)[mask], model(x)[mask])
    assert torch.allclose(model.selected_logits(x, mask, lora), model(x, lora)[mask], atol=1e-6)


def test_sparsify_cuts_the_active_neurons_per_token():
    """The L1 phase must make fewer FFN neurons fire: what lets top-k decode keep accuracy."""
    import random

    import torch

    from ablab.inference import tasks
    from ablab.inference.model.transformer import ModelConfig, TinyLM
    from ablab.inference.tokenizer import build_tokenizer
    from ablab.inference.training import make_batch, sparsify

    tok = build_tokenizer()
    torch.manual_seed(5)
    model = TinyLM(ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_layers=2, d_ff=128))
    x, _, _ = make_batch([tasks.sample(d, random.Random(i)) for i, d in enumerate(tasks.BASE_DOMAINS * 8)], random.Random(1), tok)

    def active_per_token() -> float:
        counts = []
        hooks = [blk.up.register_forward_hook(lambda _m, _i, out: counts.append((out > 0).float().sum(-1).mean())) for blk in model.blocks]
        with torch.no_grad():
            model(x)
        for h in hooks:
            h.remove()
        return float(sum(counts) / len(counts))

    before = active_per_token()
    sparsify(model, TrainConfig(batch_size=16, sparsify_steps=40, sparsify_lr=3e-3, act_l1=0.05), tok)
    after = active_per_token()
    assert after < 0.5 * before, (before, after)
