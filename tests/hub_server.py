"""A small stand-in for the Hugging Face hub on 127.0.0.1: it answers ``huggingface_hub``'s
file requests (``HEAD`` / ``GET /{repo_id}/resolve/{revision}/{filename}``) for the files it
is given, with the headers ``hf_hub_download`` reads (``ETag``, ``X-Repo-Commit``,
``Content-Length``; ``X-Error-Code: EntryNotFound`` for a missing file), and counts requests.

    with fake_hub({"timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k": {"model.safetensors": data}}) as hub:
        env["HF_ENDPOINT"] = hub.url
        ...
        hub.requests  # [("HEAD", "/timm/.../resolve/main/model.safetensors"), ("GET", ...)]
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"  # the one revision every repo here has


@dataclass
class FakeHub:
    files: dict[str, dict[str, bytes]]  # repo_id -> filename -> content
    seconds_per_mib: float = 0.0  # a slow network, so that a progress indicator can be seen
    port: int = 0
    requests: list[tuple[str, str]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def lookup(self, path: str) -> bytes | None:
        """Content for ``/{repo_id}/resolve/{revision}/{filename}``, or None."""
        for repo, files in self.files.items():
            for rev in ("main", COMMIT):
                prefix = f"/{repo}/resolve/{rev}/"
                if path.startswith(prefix) and path[len(prefix):] in files:
                    return files[path[len(prefix):]]
        return None


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self, body: bool) -> None:
            path = self.path.split("?")[0]
            hub.requests.append((self.command, path))
            data = hub.lookup(path)
            if data is None:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound" if "/resolve/" in path else "RepoNotFound")
                self.send_header("X-Error-Message", "Entry not found")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = 0
            rng = self.headers.get("Range", "")
            if body and rng.startswith("bytes=") and rng[6:].split("-")[0].isdigit():
                start = int(rng[6:].split("-")[0])
            self.send_response(206 if start else 200)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Content-Length", str(len(data) - start))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            if body:
                import time

                for i in range(start, len(data), 1 << 20):
                    self.wfile.write(data[i : i + (1 << 20)])
                    self.wfile.flush()
                    time.sleep(hub.seconds_per_mib)

        def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
            self._answer(body=False)

        def do_GET(self) -> None:  # noqa: N802
            self._answer(body=True)

        def log_message(self, *args: object) -> None:  # quiet
            pass

    return Handler


@contextlib.contextmanager
def fake_hub(files: dict[str, dict[str, bytes]], seconds_per_mib: float = 0.0) -> Iterator[FakeHub]:
    """Serve ``files`` on a free loopback port for the duration of the block."""
    hub = FakeHub(files, seconds_per_mib)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    hub.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
