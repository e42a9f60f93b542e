"""Start ``app.py`` in a subprocess on a free loopback port and wait until it answers.

    with running_app(["--weights", str(path)]) as app:
        app.url  # "http://127.0.0.1:PORT/"

Used by the app tests (one server per test module) and by ``benchmarks/bench_app.py``.
The server's output goes to a log file whose tail is shown when start-up fails.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class AppServer:
    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def log(self, tail: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def folder(self) -> Path:
        """The app's own folder (``vit_demo_<random>/`` in the temp folder): the one whose lock it holds."""
        import psutil

        for f in psutil.Process(self.proc.pid).open_files():
            p = Path(f.path)
            if p.name == ".lock" and p.parent.name.startswith("vit_demo_"):
                return p.parent
        raise RuntimeError("the app holds no folder of its own")

    def local(self, name: str) -> Path:
        """The file on this computer that a name the app gave stands for: an exposed app names
        its files ``files/...`` (vit_demo.app.server.masking), a local one by their paths."""
        from vit_demo.app.server.masking import TOKEN

        return self.folder() / "gradio" / name[len(TOKEN):] if name.startswith(TOKEN) else Path(name)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "gradio_api/info", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def start_app(args: Sequence[str] = (), timeout: float = 120.0, env: dict[str, str] | None = None,
              tries: int = 3, root: Path = ROOT) -> AppServer:
    """``python app.py --port FREE ARGS...``; returns once the API answers (or raises with the log).
    ``root``: the checkout whose app to start (another one: a before/after benchmark)."""
    last = ""
    for _ in range(tries):  # another process may grab the free port between the check and the bind
        port = free_port()
        log_path = Path(tempfile.mkstemp(prefix="vit_demo_app_", suffix=".log")[1])
        full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False",
                    "PYTHONUNBUFFERED": "1", **(env or {})}
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, str(root / "app.py"), "--host", "127.0.0.1", "--port", str(port),
                                     *args], cwd=root, env=full_env, stdout=log, stderr=subprocess.STDOUT)
        app = AppServer(proc, port, log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and app.alive():
            if _answers(app.url):
                return app
            time.sleep(0.3)
        last = app.log()
        app.stop()
        if "address already in use" not in last.lower() and "cannot find empty port" not in last.lower():
            break
    raise RuntimeError(f"the app did not start within {timeout:.0f} s; its output:\n{last}")


@contextlib.contextmanager
def running_app(args: Sequence[str] = (), **kwargs) -> Iterator[AppServer]:
    app = start_app(args, **kwargs)
    try:
        yield app
    finally:
        app.stop()
