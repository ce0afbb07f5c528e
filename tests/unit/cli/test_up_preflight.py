"""`ablab up` says what to install when Java 17 or Maven is missing, before starting anything."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ABLAB = str(Path(sys.executable).with_name("ablab"))


def test_up_without_java_names_it_and_how_to_install(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty), "ABLAB_HOME": str(tmp_path / "home")}
    done = subprocess.run([ABLAB, "up"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    text = done.stdout + done.stderr
    assert "Java 17" in text and "apt-get install" in text
    assert not (tmp_path / "home" / "run").exists()  # nothing started


def test_up_without_maven_names_it(tmp_path):
    java = shutil.which("java")
    if java is None:
        return
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "java").symlink_to(java)
    env = {**os.environ, "PATH": str(bin_dir), "ABLAB_HOME": str(tmp_path / "home")}
    done = subprocess.run([ABLAB, "up"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "Maven" in done.stdout + done.stderr
