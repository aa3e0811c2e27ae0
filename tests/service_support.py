"""Start and stop a real `chatgold serve` (a subprocess on 127.0.0.1, a free port) for the service tests."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import pytest

from conformance import repo_root


def start_service(*options: str, root: Optional[Path] = None) -> tuple:
    """(process, base URL) of `chatgold serve --port 0 [options]`, reading the checkout at `root` when given."""
    ready = Path(tempfile.mkdtemp(prefix="chatgold-service-")) / "port"
    env = dict(os.environ, CHATGOLD_ROOT=str(root)) if root is not None else None
    proc = subprocess.Popen([sys.executable, "-m", "conformance.cli", "serve", "--port", "0", "--ready-file",
                             str(ready), *options], cwd=repo_root(), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while not (ready.exists() and ready.read_text()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"service did not start: {proc.stdout.read().decode(errors='replace')}")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{ready.read_text()}"


def stop_service(proc) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
