from ablab.inference.scheduler import ArrivalRate, BatchingConfig, Scheduler


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


def test_adaptive_waits_briefly_at_high_load_and_joins_running_batches():
    s = Scheduler(BatchingConfig("adaptive", max_batch=8, window_ms=50), step_time_s=0.005)
    for i in range(200):  # 400 requests/s
        s.on_arrival(i * 0.0025)
    assert s.target_batch() > 2
    d = s.schedule(waiting_since=[0.5], running=0, now=0.5)
    assert d.admit == 0 and 0.5 < d.wake_at <= 0.5 + 2 * 0.005  # at most two decode steps
    # continuous batching: newcomers join a running batch in groups (one shared prefill)
    assert s.schedule(waiting_since=[0.5, 0.5, 0.501, 0.501], running=3, now=0.501).admit == 4
    d = s.schedule(waiting_since=[0.5, 0.501], running=3, now=0.501)
    assert d.admit == 0 and d.wake_at <= 0.5 + 4 * 0.005  # a short group waits a few steps at most
    assert s.schedule(waiting_since=[0.5, 0.501], running=3, now=0.5 + 4 * 0.005).admit == 2
    assert s.schedule(waiting_since=[0.5] * 9, running=8, now=0.6).admit == 0  # full


def test_arrival_rate_tracks_a_steady_stream():
    r = ArrivalRate(half_life_s=0.5)
    for i in range(100):
        r.observe(i * 0.01)
    assert 90 < r.rate < 110
