"""`ablab setup`, `ablab up [--demo]`, `ablab down`, `ablab status`: the whole local stack."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import typer
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from ablab.cli._common import console, fail, out
from ablab.platform.config import Settings, get_settings


def _ablab() -> str:
    return str(Path(sys.executable).with_name("ablab"))


def _require_jvm() -> None:
    if shutil.which("java") is None:
        fail("Java 17 is not installed", hint="install it (Debian: apt-get install openjdk-17-jre-headless)")
    if shutil.which("mvn") is None:
        fail("Maven is not installed; it fetches the Kafka and Flink connector jars", hint="apt-get install maven")


def setup() -> None:
    """One-time, idempotent: JVM jars via Maven, data dirs, config-DB and ClickHouse migrations."""
    from ablab.platform.registry.migrate import upgrade
    from ablab.streaming.kafka.jars import ensure_jars

    _require_jvm()
    settings = get_settings()
    for sub in ("logs", "run", "spool"):
        (settings.home / sub).mkdir(parents=True, exist_ok=True)
    with console.status("resolving JVM jars with Maven (cached after the first run)…"):
        jars = ensure_jars()
    console.print(f"[green]jars[/] {jars}")
    upgrade(settings.resolved_database_url)
    console.print("[green]config DB[/] migrated")
    from ablab.cli import analytics_store

    analytics_store.upgrade(settings)


def _demo_tokens(settings: Settings) -> dict[str, str]:
    """Admin and SDK tokens for the demo, made once and kept (0600) under ABLAB_HOME/run."""
    path = settings.home / "run" / "demo-tokens.json"
    if path.exists():
        return json.loads(path.read_text())
    from sqlalchemy import select

    from ablab.platform.auth import create_api_key, revoke_api_key_by_id
    from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
    from ablab.platform.registry.models import ApiKey
    from ablab.platform.registry.schemas import Scope

    engine = make_engine(settings.resolved_database_url)
    tokens = {}
    with transaction(make_sessionmaker(engine)) as session:
        for scope in (Scope.admin, Scope.sdk):
            name = f"demo-{scope.value}"
            # The tokens file is gone, so an older demo key of this name is unusable: retire it.
            for old in session.scalars(select(ApiKey.id).where(ApiKey.name == name, ApiKey.revoked_at.is_(None))).all():
                revoke_api_key_by_id(session, key_id=old, actor="ablab up")
            tokens[scope.value] = create_api_key(session, name=name, scope=scope)[1]
    engine.dispose()
    path.touch(mode=0o600)
    path.write_text(json.dumps(tokens))
    return tokens


WEBHOOK_SECRET_FILE = "webhook-secret"


def _webhook_secret_env(settings: Settings) -> dict[str, str]:
    """``ABLAB_WEBHOOK_SECRET`` for the API that `up` starts, unless one is configured.

    The built-in default is public, so a local stack using it would accept billing records
    signed by anyone who can reach it. Instead a random secret is made once and kept (0600)
    under ABLAB_HOME/run, beside the demo tokens: a restarted API, and whatever signs webhooks
    for this stack, read the same one. It travels only in the API's environment and that
    file, never in output or logs. A secret set in the environment or config.yaml is used
    as it is (the API reads it from there too).
    """
    if not settings.public_webhook_secret:
        return {}
    import secrets

    path = settings.home / "run" / WEBHOOK_SECRET_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        existing = path.read_text().strip()
    except FileNotFoundError:
        existing = ""
    if existing:
        return {"ABLAB_WEBHOOK_SECRET": existing}
    secret = secrets.token_urlsafe(32)
    # Created 0600 from the start (no moment readable by others); a file left empty by a
    # crash between create and write is rewritten.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret)
    return {"ABLAB_WEBHOOK_SECRET": secret}


def _services(settings: Settings, demo: bool, tokens: dict[str, str] | None,
              *, api_env: dict[str, str] | None = None):
    from ablab.cli.supervisor.processes import Service, http_ok, tcp_open

    ablab = _ablab()
    host, _, port = settings.kafka_bootstrap.rpartition(":")
    api = f"http://{settings.api_host}:{settings.api_port}"
    env = {"ABLAB_HOME": str(settings.home), "ABLAB_API_URL": api}
    if demo:
        api_env = {**_demo_api_env(), **(api_env or {})}
    services = [
        Service("kafka", [ablab, "kafka", "start", "--heap-mb", "384"], tcp_open(host or "127.0.0.1", int(port)),
                env=env, detaches=True, stop_argv=[ablab, "kafka", "stop"]),
        Service("api", [ablab, "api", "--host", settings.api_host, "--port", str(settings.api_port)], http_ok(f"{api}/readyz"),
                env={**env, **(api_env or {})}),
        Service("stream", [ablab, "stream", "submit", "--local"], lambda: True, env={**env, "JVM_ARGS": "-Xmx512m"}),
        Service("dashboard", [ablab, "dashboard", "--port", str(settings.dashboard_port), "--api-url", api],
                http_ok(f"http://127.0.0.1:{settings.dashboard_port}/_stcore/health"), env=env),
    ]
    if demo and tokens:
        sdk_env = {**env, "ABLAB_SDK_TOKEN": tokens["sdk"]}
        # The emitters write their events to outbox files (durable once written) and one
        # forwarder posts them with deterministic event_ids: a killed worker loses no event
        # of a request it answered, and a re-post is never counted twice (stack/outbox.py).
        outbox = settings.home / "outbox"

        def events_file(name: str) -> list[str]:
            return ["--events-file", str(outbox / f"{name}.jsonl")]

        services.append(Service("outbox", [ablab, "outbox", "--api-url", api], lambda: True, env=sdk_env))
        for i, wport in enumerate(settings.demo_worker_ports):
            services.append(Service(f"worker-{i}", [ablab, "worker", "--port", str(wport), "--api-url", api, "--device", "cpu",
                                                    "--experiment", "demo-serving",
                                                    *events_file(f"worker-{i}")],
                                    http_ok(f"http://127.0.0.1:{wport}/healthz"), env=sdk_env, start_timeout_s=180))
        for i, wport in enumerate(settings.demo_worker_ports):
            ledger = str(settings.home / "run" / f"ledger-{i}.jsonl")
            services.append(Service(f"traffic-{i}", [ablab, "traffic", "--worker-url", f"http://127.0.0.1:{wport}", "--rate", "4",
                                                     "--duration", f"{settings.demo_duration_s:g}", "--users", "300", "--ledger", ledger, "--api-url", api,
                                                     "--seed", str(7 + i), *events_file(f"traffic-{i}")], lambda: True, env=sdk_env))
            services.append(Service(f"labeler-{i}", [ablab, "labeler", "--ledger", ledger, "--fraction", "0.5",
                                                     "--delay-median-min", "0.2", "--api-url", api, "--seed", str(11 + i),
                                                     *events_file(f"labeler-{i}")],
                                    lambda: True, env=sdk_env))
        services.extend(_llm_services(settings, api, sdk_env, events_file))
    return services


DEMO_POLICY_REFIT_S = 60


def _demo_api_env() -> dict[str, str]:
    """The demo API refits demo-llm's router every minute, not every 5 (the default), so within
    a demo the router leaves uniform exploration once each arm has 30 graded answers (about
    6 minutes of traffic); a value set in the environment wins."""
    return {} if "ABLAB_POLICY_REFIT_S" in os.environ else {"ABLAB_POLICY_REFIT_S": str(DEMO_POLICY_REFIT_S)}


def _llm_services(settings: Settings, api: str, sdk_env: dict[str, str], events_file) -> list:
    """SmolLM2 behind llama_cpp.server and the in-repo worker, both behind `ablab gateway`;
    graded questions (`demo-llm`, half of them shadowed) and graded multi-turn conversations
    (`demo-llm-dialogue`) through the gateway, each workload with its own ledger and labeler.
    The SmolLM2 backend starts without blocking `up`: it joins when its wheel build is done
    (`ablab status` shows the progress)."""
    from ablab.cli.supervisor.processes import Service, http_ok

    ablab = _ablab()
    llm = f"http://127.0.0.1:{settings.demo_llm_port}"
    gateway = f"http://127.0.0.1:{settings.demo_gateway_port}"
    ledger = str(settings.home / "run" / "ledger-llm.jsonl")
    dialogue_ledger = str(settings.home / "run" / "ledger-llm-dialogue.jsonl")
    duration = f"{settings.demo_duration_s:g}"
    return [
        Service("llm", [ablab, "llm", "--port", str(settings.demo_llm_port)], http_ok(f"{llm}/v1/models"), env=sdk_env,
                background=True),
        Service("gateway", [ablab, "gateway", "--port", str(settings.demo_gateway_port), "--config", str(_gateway_config(settings)),
                            "--api-url", api, "--experiment", LLM_EXPERIMENT, "--experiment", DIALOGUE_EXPERIMENT],
                http_ok(f"{gateway}/healthz"), env=sdk_env),
        Service("llm-traffic", [ablab, "llm-traffic", "--gateway-url", gateway, "--wait-for", llm, "--rate", "0.5",
                                "--duration", duration, "--ledger", ledger, "--api-url", api,
                                *events_file("llm-traffic")], lambda: True, env=sdk_env),
        Service("llm-labeler", [ablab, "labeler", "--ledger", ledger, "--fraction", "1.0", "--delay-median-min", "0.2",
                                "--api-url", api, "--seed", "13", *events_file("llm-labeler")], lambda: True, env=sdk_env),
        # One conversation every ~5 s (plus its answer): SmolLM2 serves one request at a time
        # on one thread, and the QA traffic and its shadows share it.
        Service("llm-dialogue", [ablab, "llm-traffic", "--workload", "dialogue", "--gateway-url", gateway, "--wait-for", llm,
                                 "--rate", str(DIALOGUE_RATE), "--duration", duration, "--ledger", dialogue_ledger,
                                 "--api-url", api, "--seed", "17", *events_file("llm-dialogue")], lambda: True, env=sdk_env),
        Service("llm-dialogue-labeler", [ablab, "labeler", "--ledger", dialogue_ledger, "--fraction", "1.0",
                                         "--delay-median-min", "0.2", "--api-url", api, "--seed", "19",
                                         *events_file("llm-dialogue-labeler")], lambda: True, env=sdk_env),
    ]


LLM_EXPERIMENT = "demo-llm"
DIALOGUE_EXPERIMENT = "demo-llm-dialogue"  # dialogue_state off vs on, `--workload dialogue` (demo.yaml)
DIALOGUE_RATE = 0.2  # conversations a second


def _gateway_config(settings: Settings) -> Path:
    """The demo gateway's backends: SmolLM2 (llama.cpp) and the first in-repo worker, both on this CPU."""
    import yaml

    path = settings.home / "run" / "gateway.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "backends": {
            "smollm2": {"url": f"http://127.0.0.1:{settings.demo_llm_port}/v1", "kind": "llamacpp", "price": {"device": "cpu"}},
            "tiny": {"url": f"http://127.0.0.1:{settings.demo_worker_ports[0]}/v1", "kind": "openai", "price": {"device": "cpu"}},
        },
        "default_backend": "tiny",
    }))
    return path


def _apply_demo(settings: Settings, tokens: dict[str, str]) -> None:
    import subprocess

    demo = Path(__file__).resolve().parent / "supervisor" / "demo.yaml"
    env = {**os.environ, "ABLAB_TOKEN": tokens["admin"], "ABLAB_API_URL": f"http://{settings.api_host}:{settings.api_port}"}
    done = subprocess.run([_ablab(), "apply", "-f", str(demo)], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        fail(f"seeding the demo experiment failed:\n{done.stdout}{done.stderr}")


def up(demo: bool = typer.Option(False, "--demo", help="Also run workers, traffic and labelers on a seeded experiment.")) -> None:
    """Start the local stack in order, with health checks; a second `up` reuses what runs."""
    from ablab.cli.supervisor.processes import Supervisor

    _require_jvm()
    settings = get_settings()
    setup_needed = not (settings.home / "run").exists()
    if setup_needed:
        setup()
    supervisor = Supervisor(settings.home)
    tokens = _demo_tokens(settings) if demo else None
    webhook_env = _webhook_secret_env(settings)
    services = _services(settings, demo, tokens, api_env=webhook_env)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console) as progress:
        for service in services:
            task = progress.add_task(f"starting {service.name}", total=None)
            try:
                result = supervisor.start(service)
            except RuntimeError as exc:
                progress.stop()
                fail(str(exc), hint="`ablab status` shows what runs; `ablab down` stops it; logs are in " + str(supervisor.log_dir))
            progress.update(task, description=f"[green]{service.name}[/] {escape(result)}", completed=1, total=1)
            if demo and service.name == "api":
                _apply_demo(settings, tokens or {})
    out.print(f"ablab is up: API http://{settings.api_host}:{settings.api_port}/docs · "
              f"dashboard http://127.0.0.1:{settings.dashboard_port} · logs {supervisor.log_dir}")
    if tokens:
        out.print(f"demo experiments 'demo-serving', '{LLM_EXPERIMENT}' (shadowed) and '{DIALOGUE_EXPERIMENT}' running; "
                  f"admin token in {settings.home / 'run' / 'demo-tokens.json'}")
        out.print(f"gateway (OpenAI-compatible) http://127.0.0.1:{settings.demo_gateway_port}/v1 · SmolLM2 joins when its "
                  "wheel is built (`ablab status` shows the progress)")
    if webhook_env:
        out.print(f"billing webhooks are signed with the secret in {settings.home / 'run' / WEBHOOK_SECRET_FILE}")


def down() -> None:
    """Stop every ablab process of this ABLAB_HOME, in reverse start order."""
    from ablab.cli.supervisor.processes import Supervisor

    settings = get_settings()
    supervisor = Supervisor(settings.home)
    for service in reversed(_services(settings, demo=True, tokens={"sdk": "", "admin": ""})):
        result = supervisor.stop(service)
        if result != "not running":
            console.print(f"{service.name}: {result}")
    console.print("[green]ablab is down[/]")


def status() -> None:
    """What runs, with its pid and health."""
    from ablab.cli.supervisor.processes import Supervisor

    settings = get_settings()
    supervisor = Supervisor(settings.home)
    table = Table(title=f"ablab stack ({settings.home})")
    for column in ("service", "pid", "healthy", "note"):
        table.add_column(column)
    for service in _services(settings, demo=True, tokens={"sdk": "", "admin": ""}):
        pid = supervisor.pid(service.name)
        healthy = service.health() if (pid or service.detaches) else False
        if pid is None and not (service.detaches and healthy):
            continue
        note = ""
        if service.name == "llm" and not healthy:
            from ablab.inference.llamacpp import build_state

            note = build_state().describe()
        table.add_row(service.name, str(pid or "-"), "[green]yes[/]" if healthy else ("[yellow]joining[/]" if note else "[red]no[/]"), note)
    out.print(table)


def outbox(
    api_url: str = typer.Option(None, help="ablab API (default ABLAB_API_URL)."),
    token: str = typer.Option(None, envvar="ABLAB_SDK_TOKEN", help="SDK-scope API token."),
    once: bool = typer.Option(False, help="Ship what is there and exit (no tailing)."),
) -> None:
    """Ship the event files under ABLAB_HOME/outbox to POST /v1/events, each event once (the demo's emitters write them)."""
    import signal

    from ablab.platform.gateway.outbox import Forwarder, http_poster

    settings = get_settings()
    if not token:
        fail("--token (or ABLAB_SDK_TOKEN) is required", hint="ablab keys create --name outbox --scope sdk")
    forwarder = Forwarder(settings.home / "outbox", post=http_poster(api_url or settings.api_url, token))
    stopping = {"now": False}

    def _stop(*_: object) -> None:  # finish the batch in flight, save the position, exit
        stopping["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    console.print(f"outbox: shipping {forwarder.directory} to {api_url or settings.api_url}")
    if once:
        while forwarder.step():
            pass
    else:
        forwarder.run(stop=lambda: stopping["now"])
    out.print(json.dumps({"posted": forwarder.stats.posted, "torn": forwarder.stats.torn,
                          "rejected": forwarder.stats.rejected, "behind_bytes": forwarder.behind()}))


def register(app: typer.Typer) -> None:
    app.command("outbox")(outbox)
    app.command("setup")(setup)
    app.command("up")(up)
    app.command("down")(down)
    app.command("status")(status)
