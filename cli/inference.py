"""`ablab train`, `ablab worker`, `ablab traffic`, `ablab labeler`: the inference side."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ablab.cli._common import console, fail, out
from ablab.platform.config import get_settings

TOKEN_ENV = "ABLAB_SDK_TOKEN"


def _sink(api_url: str | None, token: str | None, events_file: Path | None):
    from ablab.inference.serving.events import HttpEventSink, ValidatingSink

    if events_file is not None:
        return ValidatingSink(_FileSink(events_file))
    if not token:
        fail(f"--token (or {TOKEN_ENV}) is required to send events to the API", hint="ablab keys create --name worker --scope sdk")
    return ValidatingSink(HttpEventSink(api_url or get_settings().api_url, token))


class _FileSink:
    """JSON lines, for offline runs (`ablab analyze` reads them)."""

    def __init__(self, path: Path):
        self._f = path.open("a")

    def emit(self, event: dict) -> None:
        self._f.write(json.dumps(event) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def train(
    out_dir: Path = typer.Option(None, "--out", help="Where to write the weights (default: the package's assets/)."),
    check: bool = typer.Option(False, help="Compare the digests with the shipped manifest instead of only writing."),
    eval_n: int = typer.Option(200, min=10, help="Held-out examples per domain for the accuracy report."),
    base_steps: int = typer.Option(None, min=1, help="Override the base model's steps (the shipped weights use the default)."),
    adapter_steps: int = typer.Option(None, min=1, help="Override each adapter's steps."),
    calibrate_only: bool = typer.Option(
        False, "--calibrate-only", help="Only recompute the sparse-FFN neuron calibration from the weights already in --out (seconds)."
    ),
) -> None:
    """Train the base model, the per-domain LoRA adapters and the sparse-FFN predictor (fixed seeds)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ablab.inference.assets import load_bundle
    from ablab.inference.evaluate import accuracy_report
    from ablab.inference.tokenizer import ASSETS
    from ablab.inference.training import TrainConfig, train_all

    target = out_dir or ASSETS
    shipped = json.loads((ASSETS / "manifest.json").read_text()) if (ASSETS / "manifest.json").is_file() else {}
    if calibrate_only:
        from ablab.inference.training import recalibrate

        manifest = recalibrate(target)
        out.print_json(json.dumps({"calibration": manifest["calibration"], "neurons": manifest["digests"]["neurons"]}))
        return
    tasks_ids: dict[str, int] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} loss={task.fields[loss]:.3f}"), TimeElapsedColumn(), console=console) as bar:

        def progress(phase: str, step: int, total: int, loss: float) -> None:
            if phase not in tasks_ids:
                tasks_ids[phase] = bar.add_task(phase, total=total, loss=loss)
            bar.update(tasks_ids[phase], completed=step, loss=loss)

        overrides = {k: v for k, v in (("base_steps", base_steps), ("adapter_steps", adapter_steps)) if v is not None}
        manifest = train_all(TrainConfig(**overrides), out_dir=target, progress=progress)
    report = accuracy_report(load_bundle(target), n=eval_n)
    manifest["heldout_accuracy"] = report
    (target / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    out.print_json(json.dumps({"digests": manifest["digests"], "heldout_accuracy": report}))
    if check:
        same = shipped.get("digests") == manifest["digests"]
        console.print("[green]digests match the shipped weights[/]" if same else "[yellow]digests differ from the shipped weights[/]")
        if not same:
            raise typer.Exit(1)


def worker(
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8100, min=1, max=65535),
    api_url: str = typer.Option(None, help="ablab API (default ABLAB_API_URL)."),
    token: str = typer.Option(None, envvar=TOKEN_ENV, help="SDK-scope API token."),
    strategy_map: Path = typer.Option(None, help="YAML {experiment: E, variants: {name: strategy}}: assign locally without the API."),
    events_file: Path = typer.Option(None, help="Write events as JSON lines here instead of POSTing them."),
    device: str = typer.Option("auto", help="cpu, cuda, or auto."),
    threads: int = typer.Option(1, min=1, help="torch intra-op threads."),
    experiment: list[str] = typer.Option(None, "--experiment", help="Only assign these experiments (repeatable; default all)."),
) -> None:
    """Serve the inference endpoint POST /v1/infer (strategy chosen per unit by the SDK), and
    the same model as an OpenAI-compatible backend (/v1/chat/completions, /v1/completions)."""
    import torch
    import uvicorn
    import yaml

    from ablab.inference.assets import shipped_bundle
    from ablab.inference.serving.assigners import SdkAssigner, StaticAssigner
    from ablab.inference.serving.service import InferenceService
    from ablab.inference.serving.worker import Worker, create_app

    torch.set_num_threads(threads)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    settings = get_settings()
    if strategy_map is not None:
        spec = yaml.safe_load(strategy_map.read_text())
        if not isinstance(spec, dict) or "variants" not in spec:
            fail(f"{strategy_map}: needs keys `experiment` and `variants`")
        assigner = StaticAssigner(spec.get("experiment", "local"), spec["variants"])
    else:
        if not token:
            fail(f"--token (or {TOKEN_ENV}) is required for SDK assignment", hint="or pass --strategy-map for local assignment")
        from ablab.platform.sdk import AblabClient

        client = AblabClient(api_url=api_url or settings.api_url, token=token)
        if not client.wait_ready(10):
            console.print("[yellow]SDK config not fetched yet; serving defaults until it arrives[/]")
        assigner = SdkAssigner(client, tuple(experiment) if experiment else None)
    sink = _sink(api_url, token, events_file)
    w = Worker(service=InferenceService(shipped_bundle(), device=device), assigner=assigner, sink=sink)
    console.print(f"[green]ablab worker[/] on http://{host}:{port} (device {device})")
    try:
        uvicorn.run(create_app(w), host=host, port=port, log_level="warning", access_log=False)
    finally:
        w.close()


def traffic(
    worker_url: str = typer.Option("http://127.0.0.1:8100"),
    rate: float = typer.Option(5.0, min=0.01, help="Mean requests per second."),
    duration: float = typer.Option(30.0, min=0.1, help="Seconds."),
    pattern: str = typer.Option("poisson", help="poisson or bursty."),
    users: int = typer.Option(200, min=1),
    mix: str = typer.Option("", help="domain=weight,... (default: all domains equally)."),
    ledger: Path = typer.Option(Path("traffic-ledger.jsonl"), help="Ground-truth records for the labeler."),
    api_url: str = typer.Option(None),
    token: str = typer.Option(None, envvar=TOKEN_ENV),
    events_file: Path = typer.Option(None, help="Write rum events here instead of POSTing them."),
    seed: int = typer.Option(7),
) -> None:
    """Send synthetic tasks to a worker and emit client-side (RUM) latency events."""
    from ablab.inference.traffic import TrafficConfig, run_traffic

    try:
        weights = {k: float(v) for k, v in (p.split("=") for p in mix.split(",") if p)} if mix else None
        cfg = TrafficConfig(rate=rate, duration_s=duration, pattern=pattern, users=users, seed=seed, **({"mix": weights} if weights else {}))
    except ValueError as exc:
        fail(str(exc))
    sink = _sink(api_url, token, events_file)
    result = run_traffic(worker_url=worker_url, cfg=cfg, sink=sink, ledger=ledger)
    sink.close()
    acc = result.correct / result.ok if result.ok else 0.0
    out.print_json(json.dumps({"sent": result.sent, "ok": result.ok, "failed": result.failed, "shed": result.shed, "accuracy": acc}))


def labeler(
    ledger: Path = typer.Option(Path("traffic-ledger.jsonl"), help="The traffic generator's ledger to follow."),
    fraction: float = typer.Option(0.2, min=0.0, max=1.0, help="Share of requests labeled."),
    delay_median_min: float = typer.Option(3.0, min=0.0, help="Median label delay in minutes (lognormal)."),
    delay_sigma: float = typer.Option(0.6, min=0.0),
    api_url: str = typer.Option(None),
    token: str = typer.Option(None, envvar=TOKEN_ENV),
    events_file: Path = typer.Option(None, help="Write feedback events here instead of POSTing them."),
    seed: int = typer.Option(11),
) -> None:
    """Grade served answers against ground truth and emit delayed `feedback` events."""
    from ablab.inference.labeler import Labeler, LabelerConfig, tail_ledger

    sink = _sink(api_url, token, events_file)
    lab = Labeler(LabelerConfig(fraction=fraction, delay_median_s=delay_median_min * 60, delay_sigma=delay_sigma, seed=seed), sink)
    console.print(f"labeling {fraction:.0%} of {ledger} after ~{delay_median_min} min (Ctrl-C to stop)")
    try:
        tail_ledger(ledger, lab)
    except KeyboardInterrupt:
        pass
    finally:
        sink.close()
        console.print(f"offered {lab.offered}, sampled {lab.sampled}, emitted {lab.emitted}, pending {len(lab.pending)}")


def llm_traffic(
    gateway_url: str = typer.Option("http://127.0.0.1:8090", help="The ablab gateway in front of the LLM."),
    rate: float = typer.Option(1.0, min=0.01, help="Mean requests per second."),
    duration: float = typer.Option(600.0, min=0.1, help="Seconds."),
    users: int = typer.Option(200, min=1),
    ledger: Path = typer.Option(Path("llm-ledger.jsonl"), help="Graded answers for `ablab labeler`."),
    wait_for: str = typer.Option(None, help="An OpenAI base URL (without /v1) to wait for first, e.g. the SmolLM2 backend."),
    api_url: str = typer.Option(None),
    token: str = typer.Option(None, envvar=TOKEN_ENV),
    events_file: Path = typer.Option(None, help="Write rum events here instead of POSTing them."),
    seed: int = typer.Option(5),
    workload: str = typer.Option("qa", help="qa: one question per request; dialogue: a multi-turn conversation "
                                             "that states facts and asks for one (sent as X-Ablab-Attr-Workload)."),
) -> None:
    """Ask questions with known answers through the gateway (official openai client); grade the replies."""
    import time

    from ablab.cli.supervisor.llm_demo import WORKLOADS, run_llm_traffic
    from ablab.inference import llamacpp

    if workload not in WORKLOADS:
        fail(f"--workload: {workload!r} is not one of {', '.join(WORKLOADS)}")
    sink = _sink(api_url, token, events_file)
    if wait_for:
        last = ""
        while not llamacpp.ready(wait_for):  # the SmolLM2 backend joins once its wheel is built
            state = llamacpp.build_state()
            message = state.describe() if state.state != "installed" else f"waiting for {wait_for} to serve"
            if message != last:
                console.print(f"waiting: {message}")
                last = message
            time.sleep(5)
    result = run_llm_traffic(gateway_url=gateway_url, rate=rate, duration_s=duration, users=users, sink=sink, ledger=ledger,
                             seed=seed, workload=workload)
    sink.close()
    out.print_json(json.dumps({"sent": result.sent, "ok": result.ok, "failed": result.failed, "correct": result.correct,
                               "errors": result.errors}))


def llm(
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8081, min=1, max=65535, help="Clients (or `ablab gateway`) use http://HOST:PORT/v1."),
    threads: int = typer.Option(1, min=1, help="llama.cpp threads."),
) -> None:
    """Serve SmolLM2-135M-Instruct with llama.cpp's OpenAI-compatible server (model `smollm2`);
    waits for the llama-cpp-python wheel build first, showing its progress."""
    import os

    from ablab.inference import llamacpp

    try:
        llamacpp.wait_installed(report=lambda message: console.print(f"waiting: {message}"))
        argv = llamacpp.server_argv(port=port, host=host, threads=threads)
    except llamacpp.BackendUnavailable as exc:
        fail(str(exc), hint="bash scripts/llm.sh status")
    console.print(f"[green]SmolLM2[/] on http://{host}:{port}/v1 (llama_cpp.server, model {llamacpp.MODEL_ALIAS!r})")
    os.execv(argv[0], argv)  # the server becomes this process: the supervisor's pid and signals reach it


def register(app: typer.Typer) -> None:
    app.command("llm")(llm)
    app.command("llm-traffic")(llm_traffic)
    app.command("train")(train)
    app.command("worker")(worker)
    app.command("traffic")(traffic)
    app.command("labeler")(labeler)
