import pytest
import torch

from ablab.inference.assets import Bundle
from ablab.inference.model.lora import init_adapter
from ablab.inference.model.transformer import ModelConfig, TinyLM
from ablab.inference.runtime.sparse_ffn import svd_predictor
from ablab.inference.tokenizer import build_tokenizer

torch.set_num_threads(1)


def random_adapter(cfg: ModelConfig, *, name: str, domain: str, seed: int, zero_b: bool = False) -> dict:
    layers = init_adapter(n_layers=cfg.n_layers, d_model=cfg.d_model, d_ff=cfg.d_ff, rank=4, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    if not zero_b:
        for layer in layers:
            for key in layer:
                if key.endswith(".b"):
                    layer[key] = torch.randn(layer[key].shape, generator=gen) * 0.05
    return {"name": name, "domain": domain, "rank": 4, "alpha": 8.0, "layers": layers}


@pytest.fixture(scope="session")
def tiny_bundle() -> Bundle:
    """A small random model: exactness properties hold for any weights, and it builds in ms."""
    tok = build_tokenizer()
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_layers=2, d_ff=256, max_len=64)
    model = TinyLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    adapters = {
        "ledger": random_adapter(cfg, name="ledger", domain="ledger", seed=1),
        "mirror": random_adapter(cfg, name="mirror", domain="mirror", seed=2),
        "zero": random_adapter(cfg, name="zero", domain="none", seed=3, zero_b=True),
    }
    predictors = [svd_predictor(b.up.weight.detach(), 8) for b in model.blocks]
    return Bundle(tokenizer=tok, model=model, adapters=adapters, predictors=predictors, manifest={})


@pytest.fixture(scope="session")
def calibrated_bundle(tiny_bundle) -> Bundle:
    """The tiny model with a neuron calibration: 200 of its 256 neurons live, in a shuffled
    ("hot-first") order, and at most 32 per token for tokens without an adapter."""
    from ablab.inference.training import calibrated

    gen = torch.Generator().manual_seed(7)
    d_ff = tiny_bundle.model.cfg.d_ff
    calibration = [(torch.randperm(d_ff, generator=gen)[:200], 32) for _ in tiny_bundle.model.blocks]
    return Bundle(
        tokenizer=tiny_bundle.tokenizer,
        model=tiny_bundle.model,
        adapters=tiny_bundle.adapters,
        predictors=calibrated(tiny_bundle.predictors, calibration),
        manifest={},
    )
