from ablab.inference.scheduler import MIN_CHUNK, SLACK_SAFETY, ArrivalRate, BatchingConfig, Scheduler, StepCost


def test_none_runs_one_at_a_time():
    s = Scheduler(BatchingConfig("none"))
    assert s.schedule(waiting_since=[0.0, 0.1], running=0, now=1.0).admit == 1
    assert s.schedule(waiting_since=[0.0], running=1, now=1.0).admit == 0


def test_fixed_waits_for_a_full_batch_or_the_window_and_blocks_newcomers():
    s = Scheduler(BatchingConfig("fixed", max_batch=4, window_ms=10))
    d = s.schedule(waiting_since=[0.0, 0.001], running=0, now=0.002)
    assert d.admit == 0 and abs(d.wake_at - 0.010) < 1e-9
    assert s.schedule(waiting_since=[0.0, 0.001], running=0, now=0.011).admit == 2
    assert s.schedule(waiting_since=[0.0] * 6, running=0, now=0.0).admit == 4
    assert s.schedule(waiting_since=[0.0] * 6, running=3, now=5.0).admit == 0  # static: batch runs to completion


def test_adaptive_never_waits_at_low_load():
    s = Scheduler(BatchingConfig("adaptive", max_batch=8, window_ms=50))
    for t in (0.0, 1.0, 2.0, 3.0):  # 1 request/s
        s.on_arrival(t)
    assert s.target_batch() == 1
    assert s.schedule(waiting_since=[3.0], running=0, now=3.0).admit == 1


def test_adaptive_waits_briefly_when_idle_at_high_load_and_joins_running_batches_at_once():
    s = Scheduler(BatchingConfig("adaptive", max_batch=8, window_ms=50), step_time_s=0.005)
    for i in range(200):  # 400 requests/s
        s.on_arrival(i * 0.0025)
    assert s.target_batch() > 2
    d = s.schedule(waiting_since=[0.5], running=0, now=0.5)
    assert d.admit == 0 and 0.5 < d.wake_at <= 0.5 + 2 * 0.005  # at most two decode steps
    assert s.schedule(waiting_since=[0.5], running=0, now=0.5 + 2 * 0.005).admit == 1
    # continuous batching: a newcomer rides the running batch's next step (no group wait:
    # its prompt is chunked within the step budget, so it cannot stall the batch)
    assert s.schedule(waiting_since=[0.5], running=3, now=0.5).admit == 1
    assert s.schedule(waiting_since=[0.5] * 9, running=3, now=0.6).admit == 5
    assert s.schedule(waiting_since=[0.5] * 9, running=8, now=0.6).admit == 0  # full


def test_adaptive_short_answers_under_load_wait_for_the_batch_to_drain():
    """1–3-token answers at high load: a newcomer waits for the running batch (a step or two)
    and the queue is then prefilled as one group; at low load it still joins at once."""
    busy = Scheduler(BatchingConfig("adaptive", max_batch=16, window_ms=5), step_time_s=0.005, steps_per_request=2.5)
    for i in range(200):  # 400 requests/s
        busy.on_arrival(i * 0.0025)
    assert busy.target_batch() > 1
    assert busy.schedule(waiting_since=[0.5] * 5, running=3, now=0.5).admit == 0
    assert busy.schedule(waiting_since=[0.5] * 5, running=0, now=0.5).admit == 5  # drained: one group
    quiet = Scheduler(BatchingConfig("adaptive", max_batch=16, window_ms=5), step_time_s=0.005, steps_per_request=2.5)
    for t in (0.0, 1.0, 2.0):
        quiet.on_arrival(t)
    assert quiet.schedule(waiting_since=[2.0], running=1, now=2.0).admit == 1
    long = Scheduler(BatchingConfig("adaptive", max_batch=16, window_ms=5), step_time_s=0.005, steps_per_request=26.0)
    for i in range(200):
        long.on_arrival(i * 0.0025)
    assert long.schedule(waiting_since=[0.5] * 5, running=3, now=0.5).admit == 5  # long answers: join


def test_step_cost_model_fits_intercept_and_slope():
    c = StepCost()
    for i in range(60):
        n = 1 + (i * 7) % 40
        c.observe(n, 0.003 + 0.0005 * n)
    assert abs(c.a - 0.003) < 1e-4 and abs(c.b - 0.0005) < 1e-5
    assert c.tokens_within(0.013) == 20


def _fitted(a: float, b: float, **cfg) -> Scheduler:
    s = Scheduler(BatchingConfig("adaptive", **cfg))
    for i in range(60):
        n = 1 + (i * 7) % 40
        s.on_step(a + b * n, tokens=n, decoding=min(n, 4))
    return s


def test_adaptive_prefill_budget_keeps_a_step_within_the_step_budget():
    s = _fitted(0.002, 0.0002, max_batch=32, window_ms=20, step_budget_ms=8.0)  # 30 tokens fit in 8 ms
    assert s.prefill_budget(decoding=0) is None  # nobody decoding: nobody to stall
    assert s.prefill_budget(decoding=10) == 20  # 10 decode tokens + 20 prompt tokens = 8 ms
    assert s.prefill_budget(decoding=28) == MIN_CHUNK  # prefill always progresses
    # admission stops while the decoding batch alone would leave less than a minimum chunk
    assert s.schedule(waiting_since=[0.0] * 5, running=20, now=1.0).admit == 2
    assert s.schedule(waiting_since=[0.0] * 5, running=22, now=1.0).admit == 0
    # a tighter budget admits fewer
    tight = _fitted(0.002, 0.0002, max_batch=16, window_ms=20, step_budget_ms=4.0)  # 10 tokens
    assert tight.schedule(waiting_since=[0.0] * 5, running=1, now=1.0).admit == 1
    # static policies never chunk
    assert Scheduler(BatchingConfig("fixed", 8, 5)).prefill_budget(decoding=4) is None


def test_adaptive_default_step_budget_is_three_pure_decode_steps():
    s = _fitted(0.002, 0.0002, max_batch=16)
    # 3 × (2 ms + 4 × 0.2 ms) = 8.4 ms → 32 tokens, 4 of them decode
    assert s.prefill_budget(decoding=4) == 28


def test_arrival_rate_tracks_a_steady_stream():
    r = ArrivalRate(half_life_s=0.5)
    for i in range(100):
        r.observe(i * 0.01)
    assert 90 < r.rate < 110


def test_slo_aware_budget_follows_the_running_sequences_tpot_slack():
    s = _fitted(0.002, 0.0002, max_batch=16, tpot_slo_ms=20.0, ttft_slo_ms=50.0)
    d = s.cost.seconds(2)  # a pure decode step of the two running sequences: 2.4 ms
    # just started (1 token, 0 s since): EOS could come one decode step after the next
    # step, so the next step may take SLACK_SAFETY × (20 ms − d)
    budget = s.prefill_budget(decoding=2, progress=[(1, 0.0), (1, 0.0)])
    assert budget == s.cost.tokens_within(SLACK_SAFETY * (0.020 - d)) - 2 > 0
    # a sequence 2 tokens in and 15 ms since its first: EOS next gives TPOT 15 ms + step,
    # so only SLACK_SAFETY × 5 ms remain: the step decodes alone (no prompt work fits)
    assert s.prefill_budget(decoding=2, progress=[(1, 0.0), (2, 0.015)]) == 0
    # one already past the SLO is not protected; the other's slack sets the budget
    assert s.prefill_budget(decoding=2, progress=[(1, 0.0), (2, 0.030)]) == budget
    # nobody to protect: the flat target (half the TPOT SLO) still bounds the step
    assert s.prefill_budget(decoding=2, progress=[(2, 0.030)]) == s.cost.tokens_within(0.010) - 2
    # admission is not capped by the step target when slack gates prompt work
    assert s.schedule(waiting_since=[0.0] * 20, running=10, now=1.0).admit == 6


def test_slo_aware_admission_serves_requests_that_can_still_meet_ttft_first():
    s = _fitted(0.002, 0.0002, max_batch=16, tpot_slo_ms=20.0, ttft_slo_ms=50.0)
    # waited 80 ms, 60 ms (both past the TTFT SLO), 10 ms and 1 ms
    assert s.admission_order([0.0, 0.02, 0.07, 0.079], now=0.08) == [2, 3, 0, 1]
    fifo = _fitted(0.002, 0.0002, max_batch=16, tpot_slo_ms=20.0)
    assert fifo.admission_order([0.0, 0.02, 0.07, 0.079], now=0.08) == [0, 1, 2, 3]


def test_load_shedding_refuses_only_requests_past_the_ttft_slo():
    s = _fitted(0.002, 0.0002, max_batch=16, tpot_slo_ms=20.0, ttft_slo_ms=50.0, shed_late=True)
    # the wait limit is the SLO less a first chunk's step: 50 ms − (2 + 0.2·8) ms = 46.4 ms
    assert s.to_shed([0.0, 0.02, 0.0335, 0.0337, 0.079], now=0.08) == [0, 1, 2]
    assert s.to_shed([], now=1.0) == []
    # off unless asked, and meaningless without a TTFT SLO
    assert _fitted(0.002, 0.0002, max_batch=16, tpot_slo_ms=20.0, ttft_slo_ms=50.0).to_shed([0.0], now=1.0) == []
    assert _fitted(0.002, 0.0002, max_batch=16, tpot_slo_ms=20.0, shed_late=True).to_shed([0.0], now=1.0) == []


def test_group_prefill_under_shedding_is_filled_freshest_first_and_refuses_only_the_hopeless():
    # step cost 2 ms + 0.5 ms per token; TTFT SLO 20 ms; 10-token prompts: 7 ms alone, 12 ms for two
    s = _fitted(0.002, 0.0005, max_batch=16, tpot_slo_ms=20.0, ttft_slo_ms=20.0, shed_late=True)
    now = 0.1
    waited_ms = [15.0, 9.0, 6.0, 4.0, 1.0]  # arrival order
    since = [now - w / 1000 for w in waited_ms]
    keep, refuse = s.group_admission(since, [10] * 5, now, room=16)
    # 15 ms + 7 ms alone misses: refused. Freshest first: 1 ms (7 ms step), 4 ms (12), 6 ms (17):
    # 6 + 17 = 23 > 20, so not with those two; 9 ms: also too late for a group of three
    assert refuse == [0]
    assert keep == [3, 4]
    # room caps the group; the order of a group is always arrival order
    assert s.group_admission(since, [10] * 5, now, room=1) == ([4], [0])
    # a queue that fits whole is taken whole (below capacity nothing changes)
    calm = [now - w / 1000 for w in (3.0, 2.0, 1.0)]
    assert s.group_admission(calm, [4, 4, 4], now, room=16) == ([0, 1, 2], [])
    # without shedding it is plain FCFS up to room
    fcfs = _fitted(0.002, 0.0005, max_batch=16, tpot_slo_ms=20.0, ttft_slo_ms=20.0)
    assert fcfs.group_admission(since, [10] * 5, now, room=2) == ([0, 1], [])
