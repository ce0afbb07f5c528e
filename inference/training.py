"""Training of everything ablab ships: the base model, the per-domain LoRA adapters and
the sparse-FFN neuron predictor. Fixed seeds and fixed thread count make ``ablab train``
reproduce the files in ``assets/`` (bitwise on the same torch build and thread count).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ablab.inference import tasks
from ablab.inference.model.lora import LoRAWeights, init_adapter
from ablab.inference.model.transformer import ModelConfig, TinyLM
from ablab.inference.runtime.sparse_ffn import Predictor, svd_predictor
from ablab.inference.tokenizer import ASSETS, Tokenizer, build_tokenizer

Progress = Callable[[str, int, int, float], None]  # (phase, step, total, loss)


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 20260101
    threads: int = 1  # one thread: reproducible, and 2-thread OpenMP stalls on a busy shared CPU
    # batch 128: the answer-only loss gives ~3 supervised tokens per example, and at batch 64
    # the gradient noise hid the slow retrieval/carry signal: after the same ~100 k examples
    # batch 128 (800 steps) was at answer loss 0.49, batch 64 (1,500 steps) at 0.74
    batch_size: int = 128
    base_steps: int = 1600
    base_lr: float = 3e-3
    # adapters learn in a jump: ledger (subtraction) was at 5 % after 300 steps, 69 % after 600
    adapter_steps: int = 600
    adapter_lr: float = 5e-3
    adapter_rank: int = 8
    adapter_alpha: float = 16.0
    predictor_rank: int = 32
    predictor_steps: int = 200
    # neuron calibration for the sparse FFN (base model): training-split sequences per domain,
    # and the per-token firing quantile that caps k per layer
    calib_per_domain: int = 100
    calib_quantile: float = 0.99
    # Activation sparsity: after the base is trained, fine-tune with an L1 penalty on the FFN's
    # ReLU outputs. The dense recipe fires 470-650 of 3,072 neurons per token, so exact top-192
    # selection already cost 8.5 arith points (benchmarks/bench_sparse_oracle.py); 400 steps at
    # 2e-4 bring it to ~60-100 per token and top-128 within a point of dense.
    sparsify_steps: int = 400
    sparsify_lr: float = 1e-3
    act_l1: float = 2e-4
    # lookup (retrieval by attention) is the slower task to learn, so it gets more examples
    base_mix: dict[str, float] = field(default_factory=lambda: {"arith": 0.4, "lookup": 0.6})
    buckets: int = 2  # micro-batches by length per step: less padding, same gradient
    # share of training prompts with pause tokens ("cot"); they shift the answer position
    cot_prob: float = 0.1
    # the learned positions start as a sinusoid table of this amplitude instead of noise:
    # "the token two back" is then a fixed linear map at every position, which the
    # retrieval and carry heads need (noise positions leave each position to be learned).
    # Probe (lookup only, d_ff 512, 1,500 steps): 36 % held-out vs 20 % with noise; 0.3 hurt
    pos_init: float = 0.05
    eval_n: int = 400
    # d_ff 3072 (24 x d_model): wide enough that gathering top-k rows beats the dense FFN at batch 1
    model: dict = field(default_factory=lambda: {"d_model": 128, "n_heads": 4, "n_layers": 2, "d_ff": 3072, "max_len": 64})


def _encode(examples: list[tasks.Example], rng: random.Random, tok: Tokenizer, cot_prob: float = 0.1) -> tuple[list[list[int]], list[int]]:
    seqs, starts = [], []
    for ex in examples:
        template = rng.choice(("plain", "structured"))
        cot = rng.randint(1, 8) if rng.random() < cot_prob else 0
        prompt = tok.encode(tasks.render(ex, template=template, cot_depth=cot))
        seqs.append(prompt + tok.encode(ex.answer, bos=False) + [tok.eos_id])
        starts.append(len(prompt))
    return seqs, starts


def make_batch(examples: list[tasks.Example], rng: random.Random, tok: Tokenizer, cot_prob: float = 0.1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs, targets and loss mask (answer and EOS tokens only), padded to the longest."""
    return _pad(*_encode(examples, rng, tok, cot_prob), tok)


def make_buckets(
    examples: list[tasks.Example], rng: random.Random, tok: Tokenizer, buckets: int, cot_prob: float = 0.1
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The batch split by length into `buckets` padded micro-batches (short ones stay short)."""
    seqs, starts = _encode(examples, rng, tok, cot_prob)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    size = math.ceil(len(order) / buckets)
    parts = [order[i : i + size] for i in range(0, len(order), size)]
    return [_pad([seqs[i] for i in part], [starts[i] for i in part], tok) for part in parts]


def _bucket_loss(logits: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Mean cross-entropy over every answer token of the batch, whatever the split.

    `logits(x, mask)` gives the logits at the masked positions (``TinyLM.selected_logits``)."""
    total = sum(int(m.sum()) for _, _, m in parts)
    return sum(F.cross_entropy(logits(x, m), y[m], reduction="sum") for x, y, m in parts) / total


def _pad(seqs: list[list[int]], starts: list[int], tok: Tokenizer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tok.pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), width - 1, dtype=torch.bool)
    for i, (seq, start) in enumerate(zip(seqs, starts)):
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, start - 1 : len(seq) - 1] = True
    return ids[:, :-1], ids[:, 1:], mask


def _lr(step: int, total: int, peak: float) -> float:
    warm = max(1, total // 20)
    if step < warm:
        return peak * (step + 1) / warm
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm))))


def _sample_mix(mix: dict[str, float], rng: random.Random, n: int) -> list[tasks.Example]:
    domains, weights = zip(*mix.items())
    return [tasks.sample(rng.choices(domains, weights)[0], rng) for _ in range(n)]


def sinusoid_table(n: int, d: int) -> torch.Tensor:
    """[n, d] sin/cos table: position p+k is a fixed rotation of position p for every p."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    table = torch.zeros(n, d)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)
    return table


def init_positions(model: TinyLM, amplitude: float) -> None:
    if amplitude > 0:
        with torch.no_grad():
            model.pos_emb.weight.copy_(sinusoid_table(model.cfg.max_len, model.cfg.d_model) * amplitude)


def _clipped_step(opt: torch.optim.Optimizer, loss: torch.Tensor, model: TinyLM) -> None:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def train_base(cfg: TrainConfig, tok: Tokenizer, progress: Progress | None = None) -> TinyLM:
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    model = TinyLM(ModelConfig(vocab_size=tok.vocab_size, **cfg.model))
    init_positions(model, cfg.pos_init)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.base_lr, weight_decay=0.0, betas=(0.9, 0.98))
    model.train()
    for step in range(cfg.base_steps):
        loss = _bucket_loss(model.selected_logits, make_buckets(_sample_mix(cfg.base_mix, rng, cfg.batch_size), rng, tok, cfg.buckets, cfg.cot_prob))
        for group in opt.param_groups:
            group["lr"] = _lr(step, cfg.base_steps, cfg.base_lr)
        _clipped_step(opt, loss, model)
        if progress:
            progress("base", step + 1, cfg.base_steps, loss.item())
    model.eval()
    return model


def sparsify(model: TinyLM, cfg: TrainConfig, tok: Tokenizer, progress: Progress | None = None) -> TinyLM:
    """Fine-tune the base for activation sparsity: task loss + ``act_l1`` × mean per-token L1
    of the FFN's ReLU outputs, so few neurons carry each token and top-k decode loses little."""
    if cfg.sparsify_steps <= 0:
        return model
    torch.manual_seed(cfg.seed + 50)
    rng = random.Random(cfg.seed + 50)
    acts: list[torch.Tensor] = []
    hooks = [blk.up.register_forward_hook(lambda _m, _i, out: acts.append(F.relu(out))) for blk in model.blocks]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.sparsify_lr, weight_decay=0.0, betas=(0.9, 0.98))
    model.train()
    try:
        for step in range(cfg.sparsify_steps):
            acts.clear()
            task = _bucket_loss(model.selected_logits, make_buckets(_sample_mix(cfg.base_mix, rng, cfg.batch_size), rng, tok, cfg.buckets, cfg.cot_prob))
            l1 = sum(a.sum(-1).mean() for a in acts) / len(acts)
            loss = task + cfg.act_l1 * l1
            _clipped_step(opt, loss, model)
            if progress:
                progress("sparsify", step + 1, cfg.sparsify_steps, task.item())
    finally:
        for h in hooks:
            h.remove()
    model.eval()
    return model


def _lora_layers(params: list[dict[str, torch.Tensor]], scale: float) -> list[LoRAWeights]:
    out = []
    for layer in params:
        a = {t.split(".")[0]: v.unsqueeze(0) for t, v in layer.items() if t.endswith(".a")}
        b = {t.split(".")[0]: v.unsqueeze(0) for t, v in layer.items() if t.endswith(".b")}
        out.append(LoRAWeights(a=a, b=b, scale=scale))
    return out


def train_adapter(model: TinyLM, domain: str, cfg: TrainConfig, tok: Tokenizer, progress: Progress | None = None) -> dict:
    """A LoRA adapter for `domain`; the base weights are frozen (gradients only reach A, B)."""
    seed = cfg.seed + 1 + tasks.DOMAINS.index(domain)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    c = model.cfg
    params = init_adapter(n_layers=c.n_layers, d_model=c.d_model, d_ff=c.d_ff, rank=cfg.adapter_rank, seed=seed)
    leaves = [p.requires_grad_() for layer in params for p in layer.values()]
    for p in model.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(leaves, lr=cfg.adapter_lr, weight_decay=0.0)
    scale = cfg.adapter_alpha / cfg.adapter_rank
    for step in range(cfg.adapter_steps):
        lora = _lora_layers(params, scale)
        parts = make_buckets([tasks.sample(domain, rng) for _ in range(cfg.batch_size)], rng, tok, cfg.buckets, cfg.cot_prob)
        loss = _bucket_loss(lambda x, m, lora=lora: model.selected_logits(x, m, lora), parts)
        for group in opt.param_groups:
            group["lr"] = _lr(step, cfg.adapter_steps, cfg.adapter_lr)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if progress:
            progress(f"lora:{domain}", step + 1, cfg.adapter_steps, loss.item())
    for p in model.parameters():
        p.requires_grad_(True)
    layers = [{k: v.detach().clone() for k, v in layer.items()} for layer in params]
    return {"name": domain, "domain": domain, "rank": cfg.adapter_rank, "alpha": cfg.adapter_alpha, "layers": layers}


@torch.no_grad()
def fit_predictor(model: TinyLM, cfg: TrainConfig, tok: Tokenizer, progress: Progress | None = None) -> list[Predictor]:
    """Per layer, a rank-r predictor of the FFN pre-activations, fitted on real hidden states."""
    rng = random.Random(cfg.seed + 99)
    torch.manual_seed(cfg.seed + 99)
    mix = {d: 1.0 for d in tasks.DOMAINS}
    hidden: list[list[torch.Tensor]] = [[] for _ in model.blocks]
    hooks = [blk.ln2.register_forward_hook(lambda _m, _i, o, j=j: hidden[j].append(o.reshape(-1, o.shape[-1]))) for j, blk in enumerate(model.blocks)]
    for _ in range(12):
        x, _, _ = make_batch(_sample_mix(mix, rng, cfg.batch_size), rng, tok)
        model(x)
    for h in hooks:
        h.remove()
    predictors = []
    for j, blk in enumerate(model.blocks):
        h = torch.cat(hidden[j])
        target = blk.up(h)
        pred = svd_predictor(blk.up.weight, cfg.predictor_rank)
        p1, p2 = pred.p1.clone().requires_grad_(), pred.p2.clone().requires_grad_()
        with torch.enable_grad():
            opt = torch.optim.Adam([p1, p2], lr=3e-3)
            for step in range(cfg.predictor_steps):
                sel = torch.randint(0, h.shape[0], (1024,))
                est = h[sel] @ p1 @ p2 + blk.up.bias
                # the top of the ranking matters: weight errors on neurons that actually fire
                t = target[sel]
                loss = ((est - t) ** 2 * (1 + 3 * (t > 0))).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                if progress:
                    progress(f"predictor:{j}", step + 1, cfg.predictor_steps, loss.item())
        predictors.append(Predictor(p1.detach().contiguous(), p2.detach().contiguous()))
    return predictors


@torch.no_grad()
def calibrate_neurons(model: TinyLM, cfg: TrainConfig, tok: Tokenizer) -> list[tuple[torch.Tensor, int]]:
    """Per layer of the base model: the neurons that fire on training-split tokens of every
    domain, most frequent first, and the per-token firing count at ``cfg.calib_quantile``
    rounded up to a multiple of 32. (Adapters move which neurons fire, so tokens with an
    adapter do not use it: with them layer 1's count at the 99th percentile is 512, not 128.)"""
    rng = random.Random(cfg.seed + 123)
    d_ff = model.cfg.d_ff
    fired = [torch.zeros(d_ff, dtype=torch.long) for _ in model.blocks]
    per_token: list[list[torch.Tensor]] = [[] for _ in model.blocks]
    positions = torch.arange(model.cfg.max_len)
    for domain in tasks.DOMAINS:
        seqs, _ = _encode([tasks.sample(domain, rng) for _ in range(cfg.calib_per_domain)], rng, tok, cfg.cot_prob)
        for seq in seqs:
            ids = torch.tensor([seq[: model.cfg.max_len]])
            x = model.tok_emb(ids) + model.pos_emb(positions[: ids.shape[1]])
            for j, blk in enumerate(model.blocks):
                x = blk.attend(x)
                on = (blk.up(blk.ln2(x)) > 0).reshape(-1, d_ff)
                fired[j] += on.sum(0)
                per_token[j].append(on.sum(1))
                x = blk.ffn(x)
    out = []
    for j in range(len(model.blocks)):
        order = torch.argsort(fired[j], descending=True, stable=True)
        neurons = order[: int((fired[j] > 0).sum())]
        q = torch.cat(per_token[j]).float().quantile(cfg.calib_quantile).item()
        out.append((neurons, int(math.ceil(q / 32) * 32)))
    return out


def calibrated(predictors: list[Predictor], calibration: list[tuple[torch.Tensor, int]]) -> list[Predictor]:
    return [Predictor(p.p1, p.p2, neurons, cap) for p, (neurons, cap) in zip(predictors, calibration)]


def _calibration_state(predictors: list[Predictor]) -> dict:
    return {
        "neurons": {f"{i}.neurons": p.neurons.to(torch.int16) for i, p in enumerate(predictors) if p.neurons is not None},
        "caps": {str(i): p.cap for i, p in enumerate(predictors) if p.cap is not None},
    }


def _calibration_summary(predictors: list[Predictor]) -> dict:
    """The manifest's human-readable view: live neurons and cap per layer."""
    return {f"layer{i}": {"live": len(p.neurons), "cap": p.cap} for i, p in enumerate(predictors) if p.neurons is not None}


def _calibration_digest(calibration: dict) -> str:
    return state_digest({**calibration["neurons"], **{f"{i}.cap": torch.tensor([c]) for i, c in calibration["caps"].items()}})


def recalibrate(out_dir: Path = ASSETS, cfg: TrainConfig | None = None) -> dict:
    """Recompute the neuron calibration from the weights already in `out_dir` (seconds, not
    a full training run): rewrites ``predictor.pt`` and the manifest's digest."""
    from ablab.inference.assets import load_bundle

    cfg = cfg or TrainConfig()
    torch.set_num_threads(cfg.threads)
    bundle = load_bundle(out_dir)
    predictors = calibrated(bundle.predictors, calibrate_neurons(bundle.model, cfg, bundle.tokenizer))
    saved = torch.load(out_dir / "predictor.pt", map_location="cpu", weights_only=True)
    calibration = _calibration_state(predictors)
    torch.save({"rank": saved["rank"], "state": saved["state"], **calibration}, out_dir / "predictor.pt")
    manifest = json.loads((out_dir / "manifest.json").read_text())
    manifest["digests"]["neurons"] = _calibration_digest(calibration)
    manifest["train_config"].update(calib_per_domain=cfg.calib_per_domain, calib_quantile=cfg.calib_quantile)
    manifest["calibration"] = _calibration_summary(predictors)
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def state_digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for key in sorted(state):
        h.update(key.encode())
        h.update(state[key].contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def save_all(
    *, out_dir: Path, tok: Tokenizer, model: TinyLM, adapters: list[dict], predictors: list[Predictor], cfg: TrainConfig, report: dict
) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "adapters").mkdir(exist_ok=True)
    (out_dir / "tokenizer.json").write_text(tok.to_json())
    base_state = {k: v.detach().to(torch.float16) for k, v in model.state_dict().items()}
    torch.save({"config": model.cfg.to_dict(), "state_dict": base_state}, out_dir / "base.pt")
    digests = {"base": state_digest(base_state)}
    for ad in adapters:
        half = [{k: v.to(torch.float16) for k, v in layer.items()} for layer in ad["layers"]]
        torch.save({**ad, "layers": half}, out_dir / "adapters" / f"{ad['name']}.pt")
        digests[f"adapter:{ad['name']}"] = state_digest({f"{i}.{k}": v for i, layer in enumerate(half) for k, v in layer.items()})
    pred_state = {f"{i}.{n}": getattr(p, n).to(torch.float16) for i, p in enumerate(predictors) for n in ("p1", "p2")}
    calibration = _calibration_state(predictors)
    torch.save({"rank": cfg.predictor_rank, "state": pred_state, **calibration}, out_dir / "predictor.pt")
    digests["predictor"] = state_digest(pred_state)
    if calibration["neurons"]:
        digests["neurons"] = _calibration_digest(calibration)
    manifest = {"train_config": {**cfg.__dict__}, "digests": digests, "torch": torch.__version__, **report}
    if calibration["neurons"]:
        manifest["calibration"] = _calibration_summary(predictors)
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


@torch.no_grad()
def as_served(model: TinyLM) -> TinyLM:
    """The base rounded to fp16 in place, as ``base.pt`` stores it: the adapters and the
    predictor are then fitted to the very weights that are served (and can be refitted
    from the shipped file alone, bitwise as a full run would)."""
    for p in model.parameters():
        p.copy_(p.half().float())
    return model


def train_all(cfg: TrainConfig, *, out_dir: Path = ASSETS, progress: Progress | None = None, evaluate: Callable | None = None) -> dict:
    torch.set_num_threads(cfg.threads)
    tok = build_tokenizer()
    # each phase after the base starts from the fp16-rounded weights base.pt would hold, so
    # the later phases can be refitted from a shipped file alone (bitwise as a full run)
    model = as_served(sparsify(as_served(train_base(cfg, tok, progress)), cfg, tok, progress))
    adapters = [train_adapter(model, d, cfg, tok, progress) for d in tasks.ADAPTER_DOMAINS]
    predictors = calibrated(fit_predictor(model, cfg, tok, progress), calibrate_neurons(model, cfg, tok))
    report = evaluate(model, adapters, tok) if evaluate else {}
    return save_all(out_dir=out_dir, tok=tok, model=model, adapters=adapters, predictors=predictors, cfg=cfg, report=report)
