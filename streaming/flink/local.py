"""Run the job's local mini-cluster as a child process (the stack, tests, benchmarks).

The child is ``python -m ablab.streaming.flink.job …`` in its own session, so the JVM that
PyFlink starts beneath it belongs to the same process group: :meth:`FlinkProcess.kill`
(SIGKILL, what the fault tests use) and :meth:`FlinkProcess.stop` end both, and nothing
is left running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

from ablab.streaming.flink.job import JobConfig


def job_arguments(config: JobConfig) -> list[str]:
    """The command-line flags that rebuild ``config`` in the child (see job._parse_args)."""
    args: list[str] = []
    for item in fields(JobConfig):
        value = getattr(config, item.name)
        flag = "--" + item.name.replace("_", "-")
        if item.name == "extra_config":
            for key, extra in value.items():
                args += ["--set", f"{key}={extra}"]
        elif isinstance(value, bool):
            args.append(flag if value else "--no-" + item.name.replace("_", "-"))
        elif value is not None:
            args += [flag, str(value)]
    return args


class FlinkProcess:
    """One local run of the job; ``log_path`` receives its stdout and stderr."""

    def __init__(self, config: JobConfig, *, log_path: Path, heap: str = "-Xmx512m") -> None:
        self.config = config
        self.log_path = log_path
        self.heap = heap
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> FlinkProcess:
        env = dict(os.environ)
        env.setdefault("JVM_ARGS", self.heap)
        # The JVM's own log (job status, restores, checkpoint failures) next to ours, not in
        # the shared PyFlink install folder.
        env.setdefault("FLINK_LOG_DIR", str(self.log_path.with_suffix(".jvm")))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
        log.close()
        return self

    def command(self) -> list[str]:
        """The child's argv: the job module with this configuration."""
        return [sys.executable, "-m", "ablab.streaming.flink.job", *job_arguments(self.config)]

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _signal_group(self, sig: int) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the job and its JVM (a crash, as far as Flink can tell)."""
        self._signal_group(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=30)

    def stop(self, *, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL what is still there after ``timeout_s``."""
        if self.process is None:
            return
        self._signal_group(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        self._signal_group(signal.SIGKILL)  # the JVM may outlive its Python parent
        self.process.wait(timeout=30)

    def wait(self, *, timeout_s: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout_s)

    def log_tail(self, lines: int = 60) -> str:
        """The last lines of the child's output and of the JVM's WARN/ERROR log lines."""
        texts = []
        for path in [self.log_path, *sorted(self.log_path.with_suffix(".jvm").glob("*.log"))]:
            try:
                text = path.read_text(errors="replace").splitlines()
            except FileNotFoundError:
                continue
            if path != self.log_path:
                text = [line for line in text if " WARN " in line or " ERROR " in line or "switched from" in line]
            texts.append(f"--- {path}\n" + "\n".join(text[-lines:]))
        return "\n".join(texts)
