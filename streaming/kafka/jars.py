"""JVM jars of the local stack, resolved by Maven from ``deploy/pom.xml`` and cached.

The jars land outside the repository, in ``$ABLAB_JARS_DIR`` (default
``~/.cache/ablab/jars``) under a directory named by a hash of the pom, so a changed pom
resolves afresh and an unchanged one costs nothing (Maven's own cache is ``~/.m2``):

- ``<cache>/<hash>/kafka/*.jar`` — the broker's classpath (:func:`kafka_classpath`)
- ``<cache>/<hash>/flink/flink-sql-connector-kafka-*.jar`` — :func:`kafka_connector_jar`

Resolution goes to a temporary directory and is renamed into place when complete, under
a file lock, so concurrent callers (parallel test sessions) neither race nor see half a
classpath.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
POM = REPO_ROOT / "deploy" / "pom.xml"
_COMPLETE = ".complete"


class MissingToolError(RuntimeError):
    """Java or Maven is not installed (or too old); the message says what to install."""


def jars_cache_root() -> Path:
    return Path(os.environ.get("ABLAB_JARS_DIR", Path.home() / ".cache" / "ablab" / "jars")).expanduser()


def jars_dir(pom: Path = POM) -> Path:
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    return jars_cache_root() / digest


def jars_ready(pom: Path = POM) -> bool:
    return (jars_dir(pom) / _COMPLETE).is_file()


def ensure_jars(*, pom: Path = POM, quiet: bool = True) -> Path:
    """Resolve the stack's jars once (idempotent); return the directory that holds them."""
    target = jars_dir(pom)
    if (target / _COMPLETE).is_file():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MissingToolError("Maven (`mvn`) is needed once to fetch the Kafka and Flink jars; "
                               "install it (e.g. `apt-get install maven`) and re-run `ablab setup`")
    java_version()  # fail early and clearly when Java is missing
    root = jars_cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".lock-{target.name}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / _COMPLETE).is_file():  # another process finished while we waited
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
        try:
            cmd = [mvn, "-B", "-f", str(pom), f"-Dablab.jars.dir={staging}",
                   "dependency:copy-dependencies@broker", "dependency:copy-dependencies@flink"]
            if quiet:
                cmd.insert(1, "-q")
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
                raise RuntimeError("Maven could not resolve the jars of deploy/pom.xml:\n" + "\n".join(tail))
            if not list((staging / "kafka").glob("kafka_2.13-*.jar")):
                raise RuntimeError(f"Maven finished but no Kafka broker jar is in {staging / 'kafka'}")
            (staging / _COMPLETE).touch()
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def kafka_classpath(pom: Path = POM) -> str:
    """Java ``-cp`` value for the broker (``ensure_jars`` must have run)."""
    directory = jars_dir(pom) / "kafka"
    if not (jars_dir(pom) / _COMPLETE).is_file():
        raise FileNotFoundError(f"broker jars are not resolved yet ({directory}); run `ablab setup`")
    return str(directory / "*")


def kafka_connector_jar(pom: Path = POM) -> Path:
    """Path of ``flink-sql-connector-kafka`` for ``pipeline.jars`` (``ensure_jars`` first)."""
    found = sorted((jars_dir(pom) / "flink").glob("flink-sql-connector-kafka-*.jar"))
    if not found or not jars_ready(pom):
        raise FileNotFoundError(f"the Flink Kafka connector is not resolved yet ({jars_dir(pom) / 'flink'}); "
                                "run `ablab setup`")
    return found[-1]


def java_version() -> int:
    """Major version of the ``java`` on PATH; raises MissingToolError below 17."""
    java = shutil.which("java")
    if java is None:
        raise MissingToolError("Java 17 or newer is needed for the Kafka broker and Flink; "
                               "install it (e.g. `apt-get install openjdk-17-jre-headless`)")
    done = subprocess.run([java, "-version"], capture_output=True, text=True)
    first = (done.stderr or done.stdout).splitlines()[0] if (done.stderr or done.stdout) else ""
    try:
        quoted = first.split('"')[1]
        major = int(quoted.split(".")[1] if quoted.startswith("1.") else quoted.split(".")[0].split("-")[0])
    except (IndexError, ValueError):
        raise MissingToolError(f"cannot read the Java version from {first!r}") from None
    if major < 17:
        raise MissingToolError(f"Java {major} found; Kafka 4 and Flink 2 need Java 17 or newer")
    return major
