"""`ablab up` never runs an API that accepts webhooks signed with the public default secret:
it makes a random one once, keeps it under ABLAB_HOME/run, and never prints it."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from ablab.cli import stack
from ablab.platform.config import Settings


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("ABLAB_WEBHOOK_SECRET", "ABLAB_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ABLAB_HOME", str(tmp_path))  # no config.yaml there
    return tmp_path


def test_a_random_secret_is_made_once_kept_private_and_reused(home: Path, tmp_path_factory) -> None:
    settings = Settings(home=home)
    assert settings.public_webhook_secret
    first = stack._webhook_secret_env(settings)["ABLAB_WEBHOOK_SECRET"]
    path = home / "run" / stack.WEBHOOK_SECRET_FILE
    assert path.read_text() == first and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(first) >= 40 and not Settings(home=home, webhook_secret=first).public_webhook_secret
    assert stack._webhook_secret_env(settings)["ABLAB_WEBHOOK_SECRET"] == first  # a restart signs the same way
    other = Settings(home=tmp_path_factory.mktemp("other-home"))
    assert stack._webhook_secret_env(other)["ABLAB_WEBHOOK_SECRET"] != first  # random, not derived
    path.write_text("")  # left empty by a crash between create and write
    assert stack._webhook_secret_env(settings)["ABLAB_WEBHOOK_SECRET"] not in ("", first)


def test_a_configured_secret_is_left_alone(home: Path) -> None:
    assert stack._webhook_secret_env(Settings(home=home, webhook_secret="mine")) == {}
    assert not (home / "run" / stack.WEBHOOK_SECRET_FILE).exists()


class _FakeSupervisor:
    started: list[Any] = []

    def __init__(self, home: Path) -> None:
        self.log_dir = home / "logs"

    def start(self, service: Any) -> str:
        _FakeSupervisor.started.append(service)
        return "started"


def _up(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Run `up --demo` with the processes stubbed out; the API service's environment."""
    from ablab.cli.supervisor import processes

    _FakeSupervisor.started = []
    monkeypatch.setattr(stack, "get_settings", lambda: settings)
    monkeypatch.setattr(stack, "_require_jvm", lambda: None)
    monkeypatch.setattr(stack, "_demo_tokens", lambda s: {"admin": "adm", "sdk": "sdk"})
    monkeypatch.setattr(stack, "_apply_demo", lambda s, t: None)
    monkeypatch.setattr(processes, "Supervisor", _FakeSupervisor)
    stack.up(demo=True)
    return next(s for s in _FakeSupervisor.started if s.name == "api").env


def test_up_demo_gives_the_api_the_kept_secret_and_never_prints_it(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    settings = Settings(home=home)
    (home / "run").mkdir()  # set up already
    env = _up(settings, monkeypatch)
    secret = env.get("ABLAB_WEBHOOK_SECRET")
    assert secret and not Settings(home=home, webhook_secret=secret).public_webhook_secret
    assert (home / "run" / stack.WEBHOOK_SECRET_FILE).read_text() == secret
    assert _up(settings, monkeypatch)["ABLAB_WEBHOOK_SECRET"] == secret  # a second `up` keeps it
    # Only the API gets it: no other service's environment or command line carries it.
    others = [s for s in _FakeSupervisor.started if s.name != "api"]
    assert others and not any(secret in " ".join([*s.argv, *s.env.values()]) for s in others)
    printed = capsys.readouterr()
    assert secret not in printed.out + printed.err
    assert stack.WEBHOOK_SECRET_FILE in printed.out  # where to find it, not what it is
