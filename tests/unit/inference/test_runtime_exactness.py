"""Numerical identities the runtime strategies must keep (issue 4, "Must show")."""

import pytest
import torch

from ablab.inference.engine import Engine
from ablab.inference.runtime.attention import sharded_attention
from ablab.inference.runtime.executor import Executor, RuntimeConfig
from ablab.inference.scheduler import BatchingConfig


def _ref_attention(q, k, v, mask):
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s.double(), -1).float() @ v


@pytest.mark.parametrize("shards", [1, 2, 3, 4, 7, 16])
def test_sharded_kv_attention_equals_unsharded(shards):
    g = torch.Generator().manual_seed(shards)
    q = torch.randn(3, 4, 1, 16, generator=g)
    k = torch.randn(3, 4, 37, 16, generator=g) * 3
    v = torch.randn(3, 4, 37, 16, generator=g)
    lengths = torch.tensor([37, 20, 5])
    mask = (torch.arange(37)[None, :] < lengths[:, None])[:, None, None, :]
    out = sharded_attention(q, k, v, mask=mask, n_shards=shards)
    assert (out - _ref_attention(q, k, v, mask)).abs().max().item() <= 1e-5


def test_sharded_kv_attention_causal_prefill():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 8, generator=g) for _ in range(3))
    causal = torch.ones(12, 12, dtype=torch.bool).tril()[None, None]
    for shards in (2, 4, 12):
        out = sharded_attention(q, k, v, mask=causal, n_shards=shards)
        assert (out - _ref_attention(q, k, v, causal)).abs().max().item() <= 1e-5


def _generate(bundle, runtime, prompts, adapters=None, batch=1):
    ex = Executor(bundle.model, runtime=runtime, predictors=bundle.predictors, adapters=bundle.adapters)
    eng = Engine(ex, batching=BatchingConfig("adaptive" if batch > 1 else "none", max_batch=batch, window_ms=0), eos_id=bundle.tokenizer.eos_id, slots=8)
    reqs = []
    from ablab.inference.engine import GenRequest

    for i, p in enumerate(prompts):
        row = ex.adapter_row(adapters[i]) if adapters else 0
        reqs.append(eng.submit(GenRequest(prompt_ids=bundle.tokenizer.encode(p), adapter=row, max_new_tokens=6)))
    while not all(r.done.is_set() for r in reqs):
        eng.step(block=False)
    return reqs, ex


PROMPTS = ["12+34=", "a=37,k=71;k=", "hello>", "99-3=", "kv|q=11,w=22;w="]


def _prefill_logits(bundle, runtime, prompt, adapter=None):
    ex = Executor(bundle.model, runtime=runtime, predictors=bundle.predictors, adapters=bundle.adapters)
    pool = ex.new_pool(2)
    return ex.prefill(bundle.tokenizer.encode(prompt), pool=pool, slot=0, adapter=ex.adapter_row(adapter))


def test_dense_executor_matches_training_forward(tiny_bundle):
    ids = tiny_bundle.tokenizer.encode(PROMPTS[1])
    ref = tiny_bundle.model(torch.tensor([ids]))[0, -1]
    got = _prefill_logits(tiny_bundle, RuntimeConfig(), PROMPTS[1])
    assert (got - ref).abs().max().item() <= 1e-5


@pytest.mark.parametrize("bundle_name", ["tiny_bundle", "calibrated_bundle"])
def test_sparse_ffn_with_k_equal_d_ff_equals_dense(request, bundle_name):
    """k = d_ff means every neuron, also when a calibration would restrict smaller k."""
    tiny_bundle = request.getfixturevalue(bundle_name)
    d_ff = tiny_bundle.model.cfg.d_ff
    dense, _ = _generate(tiny_bundle, RuntimeConfig(), PROMPTS)
    sparse, _ = _generate(tiny_bundle, RuntimeConfig(sparse_ffn_k=d_ff), PROMPTS)
    for a, b in zip(dense, sparse):
        assert a.tokens == b.tokens
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-4
    # decode-step logits through the gather path, not only the argmax
    lp_dense = _prefill_logits(tiny_bundle, RuntimeConfig(), PROMPTS[0])
    lp_sparse = _prefill_logits(tiny_bundle, RuntimeConfig(sparse_ffn_k=d_ff), PROMPTS[0])
    assert (lp_dense - lp_sparse).abs().max().item() <= 1e-4


def _decode_logits(bundle, runtime, prompt):
    ex = Executor(bundle.model, runtime=runtime, predictors=bundle.predictors)
    pool = ex.new_pool(1)
    ids = bundle.tokenizer.encode(prompt)
    ex.prefill(ids, pool=pool, slot=0)
    return ex.decode([ids[-1]], pool=pool, slots=[0], lengths=[len(ids)], adapters=[0])


def test_sparse_ffn_small_k_changes_decode_not_prefill(tiny_bundle):
    """Decode steps gather k neurons; the prompt runs the dense FFN (by design)."""
    full = _decode_logits(tiny_bundle, RuntimeConfig(), PROMPTS[0])
    small = _decode_logits(tiny_bundle, RuntimeConfig(sparse_ffn_k=8), PROMPTS[0])
    assert (full - small).abs().max().item() > 1e-3
    dense_prefill = _prefill_logits(tiny_bundle, RuntimeConfig(), PROMPTS[0])
    assert (dense_prefill - _prefill_logits(tiny_bundle, RuntimeConfig(sparse_ffn_k=8), PROMPTS[0])).abs().max().item() <= 1e-5


def test_lora_adapter_with_zero_b_equals_base(tiny_bundle):
    base = _prefill_logits(tiny_bundle, RuntimeConfig(), PROMPTS[2])
    zero = _prefill_logits(tiny_bundle, RuntimeConfig(), PROMPTS[2], adapter="zero")
    other = _prefill_logits(tiny_bundle, RuntimeConfig(), PROMPTS[2], adapter="mirror")
    assert (base - zero).abs().max().item() == 0.0
    assert (base - other).abs().max().item() > 1e-4  # a real adapter does change the output
    for runtime in (RuntimeConfig(sparse_ffn_k=64), RuntimeConfig(kv_shards=3)):
        a, _ = _generate(tiny_bundle, runtime, PROMPTS)
        b, _ = _generate(tiny_bundle, runtime, PROMPTS, adapters=["zero"] * len(PROMPTS))
        assert [r.tokens for r in a] == [r.tokens for r in b]


# fp32 paths only: dynamic INT8 picks one activation scale per batch tensor, so a batch
# is quantized differently from each of its rows alone (a property of the method).
@pytest.mark.parametrize(
    "runtime, bundle_name",
    [(RuntimeConfig(), "tiny_bundle"), (RuntimeConfig(sparse_ffn_k=64), "tiny_bundle"), (RuntimeConfig(kv_shards=4), "tiny_bundle"), (RuntimeConfig(sparse_ffn_k=64), "calibrated_bundle")],
    ids=["dense", "sparse64", "shards4", "sparse64-calibrated"],
)
def test_batched_results_equal_unbatched(request, runtime, bundle_name):
    tiny_bundle = request.getfixturevalue(bundle_name)
    adapters = [None, "ledger", "mirror", None, "ledger"]  # several adapters in one batch
    single = [_generate(tiny_bundle, runtime, [p], adapters=[a])[0][0] for p, a in zip(PROMPTS, adapters)]
    batched, _ = _generate(tiny_bundle, runtime, PROMPTS, adapters=adapters, batch=4)
    for s, b in zip(single, batched):
        assert s.tokens == b.tokens
        assert max((abs(x - y) for x, y in zip(s.logprobs, b.logprobs)), default=0.0) <= 1e-4


def test_sharded_kv_generation_equals_unsharded(tiny_bundle):
    one, _ = _generate(tiny_bundle, RuntimeConfig(), PROMPTS)
    four, _ = _generate(tiny_bundle, RuntimeConfig(kv_shards=4), PROMPTS)
    for a, b in zip(one, four):
        assert a.tokens == b.tokens
        assert max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs)), default=0.0) <= 1e-5


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_lower_precisions_stay_close_to_fp32(tiny_bundle, precision):
    ref = _prefill_logits(tiny_bundle, RuntimeConfig(), PROMPTS[1])
    low = _prefill_logits(tiny_bundle, RuntimeConfig(precision=precision), PROMPTS[1])
    diff = (ref - low).abs().max().item()
    assert 0.0 < diff < 0.1 * ref.abs().max().item()


@pytest.mark.parametrize("runtime", [RuntimeConfig(), RuntimeConfig(sparse_ffn_k=64), RuntimeConfig(kv_shards=2)])
def test_padded_batch_prefill_equals_one_prefill_per_prompt(tiny_bundle, runtime):
    """Prompts of different lengths and adapters in one right-padded prefill: same logits
    and the same cache contents over each prompt's own positions."""
    ex = Executor(tiny_bundle.model, runtime=runtime, predictors=tiny_bundle.predictors, adapters=tiny_bundle.adapters)
    tok = tiny_bundle.tokenizer
    prompts = [tok.encode(p) for p in PROMPTS[:4]]
    rows = [ex.adapter_row(a) for a in (None, "ledger", "mirror", None)]
    single = ex.new_pool(8)
    ref = torch.stack([ex.prefill(p, pool=single, slot=i, adapter=r) for i, (p, r) in zip(range(4), zip(prompts, rows))])
    batched = ex.new_pool(8)
    slots = [5, 1, 6, 2]  # non-contiguous slots
    got = ex.prefill_batch(prompts, pool=batched, slots=slots, adapters=rows)
    assert (got - ref).abs().max().item() <= 1e-4
    for i, (p, s) in enumerate(zip(prompts, slots)):
        for layer in range(ex.cfg.n_layers):
            assert (batched.k[layer][s, :, : len(p)] - single.k[layer][i, :, : len(p)]).abs().max().item() <= 1e-5


# ---------------------------------------------------------------- chunked prefill (issue 4)
RUNTIMES = [RuntimeConfig(), RuntimeConfig(sparse_ffn_k=64), RuntimeConfig(kv_shards=3)]


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("sizes", [(1,) * 40, (3, 5, 2, 7, 50), (8, 50)])
def test_chunked_prefill_equals_one_shot_prefill(tiny_bundle, runtime, sizes):
    """A prompt run in chunks (each chunk attends to the cache the previous ones wrote)
    gives the one-shot prefill's next-token logits and cache, with and without an adapter."""
    ex = Executor(tiny_bundle.model, runtime=runtime, predictors=tiny_bundle.predictors, adapters=tiny_bundle.adapters)
    ids = tiny_bundle.tokenizer.encode(PROMPTS[4] + PROMPTS[1])
    for adapter in (None, "ledger"):
        row = ex.adapter_row(adapter)
        one = ex.new_pool(2)
        ref = ex.prefill(ids, pool=one, slot=1, adapter=row)
        chunked = ex.new_pool(2)
        start = 0
        for n in sizes:
            if start >= len(ids):
                break
            got = ex.forward_chunks([ids[start : start + n]], pool=chunked, slots=[1], starts=[start], adapters=[row])[0]
            start += n
        assert start >= len(ids)
        assert (got - ref).abs().max().item() <= 1e-4
        for layer in range(ex.cfg.n_layers):
            assert (chunked.k[layer][1, :, : len(ids)] - one.k[layer][1, :, : len(ids)]).abs().max().item() <= 1e-5
            assert (chunked.v[layer][1, :, : len(ids)] - one.v[layer][1, :, : len(ids)]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_mixed_step_equals_separate_decode_and_prefill(tiny_bundle, runtime):
    """Decode tokens of running sequences and prompt chunks of newcomers in ONE forward give
    the logits of a separate decode step and separate prefills (sparse FFN on the decode
    tokens only, adapters per token)."""
    ex = Executor(tiny_bundle.model, runtime=runtime, predictors=tiny_bundle.predictors, adapters=tiny_bundle.adapters)
    tok = tiny_bundle.tokenizer
    running = [tok.encode(p) for p in PROMPTS[:3]]
    new = [tok.encode(p) for p in PROMPTS[3:]]
    rows_run = [ex.adapter_row(a) for a in ("mirror", None, "ledger")]
    rows_new = [ex.adapter_row(a) for a in (None, "mirror")]
    ref_pool, mix_pool = ex.new_pool(8), ex.new_pool(8)
    run_slots, new_slots = [4, 0, 6], [2, 7]
    for pool in (ref_pool, mix_pool):
        for p, s, r in zip(running, run_slots, rows_run):
            ex.prefill(p, pool=pool, slot=s, adapter=r)
    nxt = [5, 9, 11]
    ref_dec = ex.decode(nxt, pool=ref_pool, slots=run_slots, lengths=[len(p) for p in running], adapters=rows_run)
    ref_new = torch.stack([ex.prefill(p, pool=ref_pool, slot=s, adapter=r) for p, s, r in zip(new, new_slots, rows_new)])
    # second newcomer's prompt is split: its first 3 tokens now, the rest in the next step
    got = ex.forward_chunks(
        [[t] for t in nxt] + [new[0], new[1][:3]], pool=mix_pool, slots=run_slots + new_slots,
        starts=[len(p) for p in running] + [0, 0], adapters=rows_run + rows_new, n_decode=3,
    )
    assert (got[:3] - ref_dec).abs().max().item() <= 1e-4
    assert (got[3] - ref_new[0]).abs().max().item() <= 1e-4
    rest = ex.forward_chunks([new[1][3:]], pool=mix_pool, slots=[7], starts=[3], adapters=[rows_new[1]])
    assert (rest[0] - ref_new[1]).abs().max().item() <= 1e-4


@pytest.mark.parametrize("budget", [8, 9, 20])
def test_engine_chunked_prefill_generates_what_unbatched_does(tiny_bundle, budget):
    """The engine with a tiny per-step prompt budget (prompts spread over many steps, mixed
    with running decodes) generates the same tokens and log-probs as one request at a time."""
    adapters = [None, "ledger", "mirror", None, "ledger"]
    single = [_generate(tiny_bundle, RuntimeConfig(), [p], adapters=[a])[0][0] for p, a in zip(PROMPTS, adapters)]
    ex = Executor(tiny_bundle.model, runtime=RuntimeConfig(), adapters=tiny_bundle.adapters)
    eng = Engine(ex, batching=BatchingConfig("adaptive", max_batch=8, window_ms=0), eos_id=tiny_bundle.tokenizer.eos_id, slots=8)
    eng.scheduler.prefill_budget = lambda decoding, progress=None: budget  # force chunking
    from ablab.inference.engine import GenRequest

    reqs = [
        eng.submit(GenRequest(prompt_ids=tiny_bundle.tokenizer.encode(p), adapter=ex.adapter_row(a), max_new_tokens=6))
        for p, a in zip(PROMPTS, adapters)
    ]
    chunked_steps = 0
    while not all(r.done.is_set() for r in reqs):
        eng.step(block=False)
        chunked_steps += bool(eng.running and eng.prefilling)
    assert chunked_steps > 0  # decodes and partial prompts really shared steps
    for s, b in zip(single, reqs):
        assert b.error is None
        assert s.tokens == b.tokens
        assert max((abs(x - y) for x, y in zip(s.logprobs, b.logprobs)), default=0.0) <= 1e-4


def test_engine_rejects_an_overlong_prompt_alone(tiny_bundle):
    ex = Executor(tiny_bundle.model, runtime=RuntimeConfig())
    eng = Engine(ex, batching=BatchingConfig("adaptive", max_batch=4, window_ms=0), eos_id=tiny_bundle.tokenizer.eos_id, slots=4)
    from ablab.inference.engine import GenRequest

    ok = eng.submit(GenRequest(prompt_ids=tiny_bundle.tokenizer.encode(PROMPTS[0]), max_new_tokens=3))
    bad = eng.submit(GenRequest(prompt_ids=[5] * ex.cfg.max_len, max_new_tokens=3))
    while not (ok.done.is_set() and bad.done.is_set()):
        eng.step(block=False)
    assert ok.error is None and ok.tokens
    assert bad.error is not None and "prompt" in bad.error
    assert len(eng.pool.free) == 4  # every slot back


def _run_alone(bundle, eos_id, prompt_ids, target):
    from ablab.inference.engine import GenRequest

    ex = Executor(bundle.model, runtime=RuntimeConfig(), adapters=bundle.adapters)
    eng = Engine(ex, batching=BatchingConfig("none", max_batch=1, window_ms=0), eos_id=eos_id, slots=1)
    req = eng.submit(GenRequest(prompt_ids=prompt_ids, max_new_tokens=target, ignore_eos=True))
    while not req.done.is_set():
        eng.step(block=False)
    return req


def test_ignore_eos_generates_exactly_the_target_length(tiny_bundle):
    """Serving-benchmark requests: EOS is an ordinary token and generation runs to the target.
    The engine's EOS is set to the token the model emits first, so a normal request stops at
    once and an ignore-EOS one must run through EOS (also at later positions)."""
    from ablab.inference.engine import GenRequest

    ids = tiny_bundle.tokenizer.encode(PROMPTS[1])
    first = _run_alone(tiny_bundle, tiny_bundle.tokenizer.eos_id, ids, 1).tokens[0]
    ex = Executor(tiny_bundle.model, runtime=RuntimeConfig())
    eng = Engine(ex, batching=BatchingConfig("none", max_batch=1, window_ms=0), eos_id=first, slots=1)
    normal = eng.submit(GenRequest(prompt_ids=ids, max_new_tokens=20))
    while not normal.done.is_set():
        eng.step(block=False)
    assert normal.error is None and normal.tokens == []  # stopped at the "EOS"
    for target in (1, 2, 20, ex.cfg.max_len - len(ids)):  # the last one fills the context exactly
        r = _run_alone(tiny_bundle, first, ids, target)
        assert r.error is None
        assert len(r.tokens) == target == len(r.logprobs)
        assert r.tokens[0] == first


def test_ignore_eos_batched_equals_unbatched(tiny_bundle):
    """Requests with target lengths and ignore-EOS, served together by the adaptive engine
    (continuous batching, prompts chunked across decode steps, sequences finishing at
    different steps) generate the same tokens and log-probs as each one alone."""
    from ablab.inference.engine import GenRequest

    prompts = [tiny_bundle.tokenizer.encode(p) for p in PROMPTS]
    eos = _run_alone(tiny_bundle, tiny_bundle.tokenizer.eos_id, prompts[0], 1).tokens[0]
    targets = [30, 4, 64 - len(prompts[2]), 1, 17]
    single = [_run_alone(tiny_bundle, eos, p, t) for p, t in zip(prompts, targets)]
    ex = Executor(tiny_bundle.model, runtime=RuntimeConfig(), adapters=tiny_bundle.adapters)
    eng = Engine(ex, batching=BatchingConfig("adaptive", max_batch=8, window_ms=0), eos_id=eos, slots=8)
    eng.scheduler.prefill_budget = lambda decoding, progress=None: 8  # force chunked prompts
    reqs = [eng.submit(GenRequest(prompt_ids=p, max_new_tokens=t, ignore_eos=True)) for p, t in zip(prompts[:3], targets[:3])]
    for _ in range(3):  # later arrivals join a running batch
        eng.step(block=False)
    reqs += [eng.submit(GenRequest(prompt_ids=p, max_new_tokens=t, ignore_eos=True)) for p, t in zip(prompts[3:], targets[3:])]
    while not all(r.done.is_set() for r in reqs):
        eng.step(block=False)
    assert any(eos in r.tokens for r in reqs)  # EOS really was generated and ignored
    for s, b, t in zip(single, reqs, targets):
        assert b.error is None and len(b.tokens) == t
        assert s.tokens == b.tokens
        assert max((abs(x - y) for x, y in zip(s.logprobs, b.logprobs)), default=0.0) <= 1e-4
    assert len(eng.pool.free) == 8


def test_serving_trace_targets_fit_the_context(tiny_bundle):
    from ablab_testing import inference_bench as b

    trace = b.poisson_trace(tiny_bundle, rate=200.0, duration_s=2.0, seed=1, workload="serving")
    assert len(trace) > 100
    lens = [t for _, _, t in trace]
    assert all(1 <= t <= b.SERVING_OUT[1] and len(ids) + t <= tiny_bundle.model.cfg.max_len for _, ids, t in trace)
    assert min(lens) <= 8 and max(lens) >= 35  # a wide spread, not one length
    assert all(t is None for _, _, t in b.poisson_trace(tiny_bundle, rate=200.0, duration_s=0.5, seed=1, workload="task"))
    req = b.make_request(trace[0][1], trace[0][2])
    assert req.ignore_eos and req.max_new_tokens == trace[0][2]
    assert not b.make_request(trace[0][1], None).ignore_eos


@pytest.mark.parametrize(
    "runtime",
    [RuntimeConfig(), RuntimeConfig(sparse_ffn_k=64), RuntimeConfig(sparse_ffn_k=256), RuntimeConfig(kv_shards=3), RuntimeConfig(precision="int8"), RuntimeConfig(precision="int8", sparse_ffn_k=64)],
    ids=["dense", "sparse64", "sparse-all", "shards3", "int8", "int8-sparse64"],
)
@pytest.mark.parametrize("bundle_name", ["tiny_bundle", "calibrated_bundle"])
def test_batch_one_decode_path_equals_the_general_path(request, runtime, bundle_name):
    """A lone sequence takes the few-kernel path (runtime/single.py); a batch of two copies of
    it takes the general one. Logits and the cache entries written must agree (calibrated:
    the batch-1 path keeps only the live neurons' rows, the general path masks the rest)."""
    tiny_bundle = request.getfixturevalue(bundle_name)
    ex = Executor(tiny_bundle.model, runtime=runtime, predictors=tiny_bundle.predictors)
    general = Executor(tiny_bundle.model, runtime=runtime, predictors=tiny_bundle.predictors, few_kernel=False)
    assert ex._single is not None and general._single is None
    ids = tiny_bundle.tokenizer.encode(PROMPTS[1])
    solo, pair = ex.new_pool(1), general.new_pool(2)
    ex.prefill(ids, pool=solo, slot=0)
    for s in (0, 1):
        general.prefill(ids, pool=pair, slot=s)
    tok, n = ids[-1], len(ids)
    for step in range(4):  # several positions: the cache grows under both paths
        one = ex.decode([tok], pool=solo, slots=[0], lengths=[n + step], adapters=[0])
        two = general.decode([tok, tok], pool=pair, slots=[0, 1], lengths=[n + step] * 2, adapters=[0, 0])
        assert (one[0] - two[0]).abs().max().item() <= 1e-5
        tok = int(one[0].argmax())
    for layer in range(ex.cfg.n_layers):
        assert (solo.k[layer][0] - pair.k[layer][0]).abs().max().item() <= 1e-5
        assert (solo.v[layer][0] - pair.v[layer][0]).abs().max().item() <= 1e-5


@pytest.mark.parametrize(
    "runtime",
    [RuntimeConfig(), RuntimeConfig(sparse_ffn_k=64), RuntimeConfig(sparse_ffn_k=256), RuntimeConfig(kv_shards=3)],
    ids=["dense", "sparse64", "sparse-all", "shards3"],
)
@pytest.mark.parametrize("bundle_name", ["tiny_bundle", "calibrated_bundle"])
@pytest.mark.parametrize("slots", [[0, 1, 2], [3, 0, 2]], ids=["one-range", "scattered"])
def test_few_kernel_batched_decode_equals_the_general_path(request, runtime, bundle_name, slots):
    """A few sequences without adapters decode through `SingleDecode.step_many`: different
    lengths (masks), slots in one range (views) or scattered (gathers), several steps."""
    bundle = request.getfixturevalue(bundle_name)
    fast = Executor(bundle.model, runtime=runtime, predictors=bundle.predictors)
    general = Executor(bundle.model, runtime=runtime, predictors=bundle.predictors, few_kernel=False)
    prompts = [bundle.tokenizer.encode(p) for p in PROMPTS[:3]]
    pools = {id(e): e.new_pool(4) for e in (fast, general)}
    for e in (fast, general):
        for ids, slot in zip(prompts, slots):
            e.prefill(ids, pool=pools[id(e)], slot=slot)
    toks, lengths = [ids[-1] for ids in prompts], [len(ids) for ids in prompts]
    assert len(set(lengths)) > 1
    for _ in range(4):
        a = fast.decode(toks, pool=pools[id(fast)], slots=slots, lengths=lengths, adapters=[0, 0, 0])
        b = general.decode(toks, pool=pools[id(general)], slots=slots, lengths=lengths, adapters=[0, 0, 0])
        assert (a - b).abs().max().item() <= 1e-5
        toks, lengths = [int(t) for t in a.argmax(-1)], [n + 1 for n in lengths]
    for layer in range(fast.cfg.n_layers):
        for slot in slots:
            assert (pools[id(fast)].k[layer][slot] - pools[id(general)].k[layer][slot]).abs().max().item() <= 1e-5
    same = [bundle.tokenizer.encode(PROMPTS[1])] * 2  # equal lengths, one range: slice writes
    for e in (fast, general):
        for s in (0, 1):
            e.prefill(same[s], pool=pools[id(e)], slot=s)
    a = fast.decode([5, 5], pool=pools[id(fast)], slots=[0, 1], lengths=[len(same[0])] * 2, adapters=[0, 0])
    b = general.decode([5, 5], pool=pools[id(general)], slots=[0, 1], lengths=[len(same[0])] * 2, adapters=[0, 0])
    assert (a - b).abs().max().item() <= 1e-5


def test_int8_everywhere_keeps_the_general_path(tiny_bundle):
    """The one-token path runs QKV and out in float, so it stands aside when int8 is asked there."""
    ex = Executor(tiny_bundle.model, runtime=RuntimeConfig(precision="int8"), int8_min_tokens={"qkv": 1, "out": 1, "up": 1, "down": 1})
    assert ex._single is None


@pytest.mark.parametrize("shed_late", [True, False])
def test_engine_sheds_only_requests_that_already_missed_the_ttft_slo(tiny_bundle, shed_late):
    from ablab.inference.engine import GenRequest

    ex = Executor(tiny_bundle.model, runtime=RuntimeConfig(), predictors=tiny_bundle.predictors)
    cfg = BatchingConfig("adaptive", max_batch=4, window_ms=0, tpot_slo_ms=1000.0, ttft_slo_ms=1000.0, shed_late=shed_late)
    eng = Engine(ex, batching=cfg, eos_id=tiny_bundle.tokenizer.eos_id, slots=4)
    reqs = [eng.submit(GenRequest(prompt_ids=tiny_bundle.tokenizer.encode(p), max_new_tokens=3)) for p in PROMPTS * 2]
    stale = reqs[::3]
    for r in stale:  # as if they had queued for 5 s behind an overload
        r.submitted -= 5.0
    while not all(r.done.is_set() for r in reqs):
        eng.step(block=False)
    refused = [r for r in reqs if r.error]
    if not shed_late:
        assert refused == [] and eng.shed == 0
        return
    assert refused == stale and eng.shed == len(stale)
    for r in refused:
        assert r.tokens == [] and r.first_token_at is None
        assert "overloaded" in r.error and "1000 ms TTFT SLO" in r.error
    assert all(r.tokens for r in reqs if r not in stale)
    assert len(eng.pool.free) == 4  # refused requests never took a cache slot


def test_engine_sheds_admitted_requests_whose_prompt_has_not_started(tiny_bundle):
    """Admitted requests can wait for TPOT slack before their first chunk; past the TTFT SLO
    they are refused too, and give their cache slot back."""
    from ablab.inference.engine import GenRequest

    ex = Executor(tiny_bundle.model, runtime=RuntimeConfig(), predictors=tiny_bundle.predictors)
    # a TPOT SLO no step can meet leaves no prompt budget while sequences decode
    cfg = BatchingConfig("adaptive", max_batch=8, window_ms=0, tpot_slo_ms=1e-3, ttft_slo_ms=1000.0, shed_late=True)
    eng = Engine(ex, batching=cfg, eos_id=tiny_bundle.tokenizer.eos_id, slots=8)
    ids = [tiny_bundle.tokenizer.encode(p) for p in PROMPTS]
    first = [eng.submit(GenRequest(prompt_ids=i, max_new_tokens=20)) for i in ids[:2]]
    eng.step(block=False)  # nobody decoding yet: whole prompts run
    assert len(eng.running) == 2
    later = [eng.submit(GenRequest(prompt_ids=i, max_new_tokens=3)) for i in ids[2:]]
    eng.step(block=False)  # admitted, but no prompt budget beside the two decodes
    assert [r.prefilled for r in eng.prefilling] == [0, 0, 0] and len(eng.pool.free) == 3
    later[1].submitted -= 5.0
    eng.step(block=False)
    assert later[1].done.is_set() and "overloaded" in later[1].error and later[1].tokens == []
    assert later[1] not in eng.prefilling and len(eng.pool.free) == 4 and eng.shed == 1
    while not all(r.done.is_set() for r in first + later):
        eng.step(block=False)
    assert all(r.tokens and not r.error for r in first + [later[0], later[2]])


def test_calibration_restricts_tokens_without_an_adapter_only(calibrated_bundle, tiny_bundle):
    """Base tokens choose among live neurons, at most the cap; adapter tokens keep plain top-k."""
    from ablab.inference.runtime.sparse_ffn import select_neurons

    ex = Executor(calibrated_bundle.model, runtime=RuntimeConfig(sparse_ffn_k=64), predictors=calibrated_bundle.predictors)
    live = set(calibrated_bundle.predictors[0].neurons.tolist())
    x = torch.randn(6, calibrated_bundle.model.cfg.d_model)
    base_tokens = torch.tensor([True, False, True, False, True, False])
    idx, keep = select_neurons(x, ex.predictors[0], ex.tables[0].up_b, 64, base=ex.base_calibration[0], base_tokens=base_tokens)
    for row, is_base in enumerate(base_tokens.tolist()):
        chosen = {int(i) for i, w in zip(idx[row], keep[row]) if w > 0}
        if is_base:
            assert chosen <= live and len(chosen) == 32
        else:
            assert len(chosen) == 64 and not chosen <= live  # a dead neuron among 64 of 256: all but certain
    # an adapter's tokens decode exactly as without the calibration, base tokens do not
    plain = _generate(tiny_bundle, RuntimeConfig(sparse_ffn_k=64), PROMPTS, adapters=["ledger"] * len(PROMPTS))[0]
    calib = _generate(calibrated_bundle, RuntimeConfig(sparse_ffn_k=64), PROMPTS, adapters=["ledger"] * len(PROMPTS))[0]
    for a, b in zip(plain, calib):  # the same neurons, summed in another order
        assert a.tokens == b.tokens
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-5
    assert (_decode_logits(tiny_bundle, RuntimeConfig(sparse_ffn_k=64), PROMPTS[0]) - _decode_logits(calibrated_bundle, RuntimeConfig(sparse_ffn_k=64), PROMPTS[0])).abs().max().item() > 1e-4


def test_engine_group_prefill_leaves_waiting_a_request_the_group_would_make_late(tiny_bundle):
    """Shedding, nothing running: the group is filled freshest first with requests it keeps on
    time; an old request that would make it alone but not in the group waits at the head."""
    from ablab.inference.engine import GenRequest

    ex = Executor(tiny_bundle.model, runtime=RuntimeConfig(), predictors=tiny_bundle.predictors)
    cfg = BatchingConfig("adaptive", max_batch=8, window_ms=0, tpot_slo_ms=1000.0, ttft_slo_ms=1000.0, shed_late=True)
    eng = Engine(ex, batching=cfg, eos_id=tiny_bundle.tokenizer.eos_id, slots=8)
    ids = [tiny_bundle.tokenizer.encode(p) for p in PROMPTS]
    assert min(map(len, ids)) >= 5  # each extra prompt adds ≥ 1 ms to the predicted group step
    old = eng.submit(GenRequest(prompt_ids=ids[0], max_new_tokens=3))
    fresh = [eng.submit(GenRequest(prompt_ids=i, max_new_tokens=3)) for i in ids[1:]]
    alone_s = eng.scheduler.cost.seconds(len(ids[0]))
    old.submitted -= 1.0 - alone_s - 0.002  # on time alone by ~2 ms (less the test's own time)
    eng.step(block=False)
    assert list(eng.waiting) == [old] and not old.done.is_set()
    assert {id(r) for r in eng.running + eng.prefilling} == {id(r) for r in fresh}
    while not all(r.done.is_set() for r in [old, *fresh]):
        eng.step(block=False)
    assert all(r.tokens and not r.error for r in fresh)
    assert old.tokens or "overloaded" in old.error  # joined the running batch in time, or refused
    assert len(eng.pool.free) == 8
