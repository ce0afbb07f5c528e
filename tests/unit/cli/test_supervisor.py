"""The stack's supervisor on real processes: start, health, reuse, stop, no leftovers."""

from __future__ import annotations

import os
import sys

from ablab.cli.supervisor.processes import Service, Supervisor, http_ok


def test_start_reuse_and_stop_leave_nothing_behind(tmp_path) -> None:
    from ablab_testing import free_port

    port = free_port()
    service = Service(
        name="web",
        argv=[sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        health=http_ok(f"http://127.0.0.1:{port}/"),
        start_timeout_s=30,
    )
    supervisor = Supervisor(tmp_path)
    assert supervisor.start(service) == "started"
    pid = supervisor.pid("web")
    assert pid is not None
    assert supervisor.start(service) == "reused"  # a second `up` reuses it
    assert supervisor.pid("web") == pid
    assert supervisor.stop(service) == "stopped"
    assert supervisor.pid("web") is None
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/status").read().find("zombie") >= 0
    assert supervisor.stop(service) == "not running"


def test_a_crashing_service_reports_its_log(tmp_path) -> None:
    service = Service(
        name="bad",
        argv=[sys.executable, "-c", "import sys; print('boom: missing config'); sys.exit(3)"],
        health=lambda: False,
        start_timeout_s=10,
    )
    supervisor = Supervisor(tmp_path)
    try:
        supervisor.start(service)
    except RuntimeError as exc:
        assert "exited with 3" in str(exc) and "boom: missing config" in str(exc)
    else:
        raise AssertionError("a crashing service must raise")


def test_stop_reaches_a_child_left_behind_by_its_leader(tmp_path) -> None:
    """The leader exits on SIGTERM, its child (like the Flink JVM) ignores it: stop must not
    report success while the child lives; it SIGKILLs the group."""
    from ablab.cli.supervisor.processes import group_alive

    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('child up', flush=True); time.sleep(300)"
    leader = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {stubborn!r}]); time.sleep(300)"
    ready = tmp_path / "logs" / "pair.log"
    service = Service(name="pair", argv=[sys.executable, "-c", leader], health=lambda: ready.exists() and "child up" in ready.read_text(),
                      start_timeout_s=30)
    supervisor = Supervisor(tmp_path)
    assert supervisor.start(service) == "started"
    pid = supervisor.pid("pair")
    assert pid is not None
    assert supervisor.stop(service, timeout_s=2) == "killed after SIGTERM timeout"
    assert not group_alive(pid)
    assert supervisor.stop(service) == "not running"


def test_a_running_service_that_is_slow_to_answer_is_waited_for_not_started_twice(tmp_path) -> None:
    """A second `up` while the service is busy (health fails for a while): the supervisor waits
    for the running process instead of starting a copy that would take over its pidfile and
    leave it running with nothing for `down` to stop."""
    answers = iter([False, False, True, True])
    busy_then_ok = lambda: next(answers)
    service = Service(name="slow", argv=[sys.executable, "-c", "import time; time.sleep(300)"], health=lambda: True, start_timeout_s=10)
    supervisor = Supervisor(tmp_path)
    assert supervisor.start(service) == "started"
    pid = supervisor.pid("slow")
    again = Service(name="slow", argv=[sys.executable, "-c", "raise SystemExit('a second copy must not start')"], health=busy_then_ok, start_timeout_s=10)
    assert supervisor.start(again) == "reused"
    assert supervisor.pid("slow") == pid
    hung = Service(name="slow", argv=again.argv, health=lambda: False, start_timeout_s=1)
    try:
        supervisor.start(hung)
    except RuntimeError as exc:
        assert f"runs (pid {pid})" in str(exc) and "ablab down" in str(exc)
    else:
        raise AssertionError("an unhealthy running service must be reported, not duplicated")
    assert supervisor.pid("slow") == pid
    assert supervisor.stop(service) == "stopped"


def test_a_background_service_does_not_hold_up_the_stack(tmp_path) -> None:
    """An optional service (the SmolLM2 backend) that is not healthy yet, or cannot run at
    all, is reported, not fatal; a second `up` reuses it without waiting for its health."""
    supervisor = Supervisor(tmp_path)
    waiting = Service(name="slow", argv=[sys.executable, "-c", "import time; time.sleep(60)"], health=lambda: False,
                      background=True)
    assert supervisor.start(waiting).startswith("started; joins when ready")
    assert supervisor.start(waiting) == "reused"
    assert supervisor.stop(waiting) == "stopped"
    broken = Service(name="broken", argv=[sys.executable, "-c", "import sys; print('no wheel'); sys.exit(1)"],
                     health=lambda: False, background=True)
    assert supervisor.start(broken) == "not running (exit 1): no wheel"
