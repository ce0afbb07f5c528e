"""Is the sparse-FFN accuracy loss the predictor's fault, or the model's activation density?

    .venv/bin/python benchmarks/bench_sparse_oracle.py --domain arith --n 200

Prints, for the shipped weights:

1. how many FFN neurons are active (ReLU > 0) per token, per layer, on held-out prompts;
2. held-out exact match at each top-k with the shipped rank-r predictor, a rank-64 SVD
   predictor, and an **oracle** that selects by the exact pre-activations (full-rank
   "predictor": the best any selection-by-score can do).

If the oracle loses as much accuracy as the shipped predictor at a given k, a better predictor
cannot help there: the model needs more neurons per token than k.
"""

from __future__ import annotations

import argparse
import time

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", default="arith")
    parser.add_argument("--n", type=int, default=200, help="held-out examples per configuration")
    parser.add_argument("--ks", default="384,192,128,96")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from ablab.inference import tasks
    from ablab.inference.assets import load_bundle
    from ablab.inference.evaluate import accuracy
    from ablab.inference.runtime.executor import RuntimeConfig
    from ablab.inference.runtime.sparse_ffn import Predictor, svd_predictor

    bundle = load_bundle()
    model, tok = bundle.model, bundle.tokenizer
    d_ff = model.cfg.d_ff

    active: dict[int, list[torch.Tensor]] = {j: [] for j in range(len(model.blocks))}
    hooks = [blk.up.register_forward_hook(lambda _m, _i, out, j=j: active[j].append((out > 0).sum(-1).flatten().float()))
             for j, blk in enumerate(model.blocks)]
    with torch.no_grad():
        for ex in tasks.heldout_set(args.domain, min(args.n, 100)):
            model(torch.tensor([tok.encode(tasks.render(ex)) + tok.encode(ex.answer, bos=False)]))
    for h in hooks:
        h.remove()
    print(f"active FFN neurons per token ({args.domain}, held-out), of d_ff = {d_ff}:")
    for j, counts in active.items():
        c = torch.cat(counts)
        print(f"  layer {j}: mean {c.mean():.0f}, p50 {c.median():.0f}, p90 {c.quantile(0.9):.0f}, max {c.max():.0f}")

    exact = [Predictor(torch.eye(blk.up.weight.shape[1]), blk.up.weight.detach().float().T.contiguous()) for blk in model.blocks]
    selectors = {
        f"shipped (rank {bundle.predictors[0].p1.shape[1]})": bundle.predictors,
        "svd rank 64": [svd_predictor(blk.up.weight.detach(), 64) for blk in model.blocks],
        "oracle (exact pre-activations)": exact,
    }
    ks = [int(k) for k in args.ks.split(",")]
    dense = accuracy(bundle, domain=args.domain, n=args.n)
    print(f"\nheld-out exact match, {args.domain}, n = {args.n}; dense {dense:.1%}")
    print(f"{'selection':<32}" + "".join(f"{f'k={k}':>9}" for k in ks))
    started = time.perf_counter()
    for name, predictors in selectors.items():
        bundle.predictors = predictors
        row = [accuracy(bundle, domain=args.domain, runtime=RuntimeConfig(sparse_ffn_k=k), n=args.n) for k in ks]
        print(f"{name:<32}" + "".join(f"{a:>9.1%}" for a in row))
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
