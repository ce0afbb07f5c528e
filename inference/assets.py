"""Loading the shipped weights: base model, LoRA adapters, neuron predictor, manifest."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from ablab.inference.model.transformer import ModelConfig, TinyLM
from ablab.inference.runtime.sparse_ffn import Predictor
from ablab.inference.tokenizer import ASSETS, Tokenizer, load_tokenizer


@dataclass
class Bundle:
    tokenizer: Tokenizer
    model: TinyLM
    adapters: dict[str, dict]
    predictors: list[Predictor]
    manifest: dict

    @property
    def adapter_domains(self) -> dict[str, str]:
        """domain → adapter name."""
        return {a["domain"]: name for name, a in self.adapters.items()}


def load_bundle(path: Path = ASSETS) -> Bundle:
    base_file = path / "base.pt"
    if not base_file.is_file():
        raise FileNotFoundError(f"{base_file} is missing; run `ablab train` to produce the shipped weights")
    base = torch.load(base_file, map_location="cpu", weights_only=True)
    model = TinyLM(ModelConfig(**base["config"]))
    model.load_state_dict({k: v.float() for k, v in base["state_dict"].items()})
    model.eval()
    adapters = {}
    for f in sorted((path / "adapters").glob("*.pt")):
        ad = torch.load(f, map_location="cpu", weights_only=True)
        adapters[ad["name"]] = ad
    pred = torch.load(path / "predictor.pt", map_location="cpu", weights_only=True)
    neurons, caps = pred.get("neurons", {}), pred.get("caps", {})
    predictors = [
        Predictor(
            pred["state"][f"{i}.p1"].float(),
            pred["state"][f"{i}.p2"].float(),
            neurons[f"{i}.neurons"].long() if f"{i}.neurons" in neurons else None,
            caps.get(str(i)),
        )
        for i in range(model.cfg.n_layers)
    ]
    manifest_file = path / "manifest.json"
    manifest = json.loads(manifest_file.read_text()) if manifest_file.is_file() else {}
    tok = load_tokenizer(path / "tokenizer.json")
    return Bundle(tokenizer=tok, model=model, adapters=adapters, predictors=predictors, manifest=manifest)


@lru_cache(maxsize=1)
def shipped_bundle() -> Bundle:
    return load_bundle(ASSETS)
