"""No server path in what an exposed app sends: Gradio's file names, rewritten on the way out and
back on the way in.

Gradio names every file it serves by its absolute path in its upload and cache folder (the app's
own, ``/tmp/vit_demo_<random>/gradio/``): the example photos in ``/config`` and in the page,
every upload's answer, every picture an event sends to the page, each one's ``/file=`` address.
The page and gradio_client send those names back as they got them. :class:`PathMask`, an ASGI
middleware inside the gate (:mod:`vit_demo.app.server.middleware`):

- in every JSON, HTML, plain-text and event-stream response (the config, the page, the upload
  route's answer, the queue's results, error texts) replaces that folder's path with
  :data:`TOKEN` (``files/``): ``/tmp/vit_demo_x1y2/gradio/3fa9.../chelsea.png`` reaches the
  client as ``files/3fa9.../chelsea.png``; a response it cannot read (compressed) goes as it is;
- in the requests that name files, puts the folder's path back: the file route's address
  (``/gradio_api/file=files/...``) and the bodies of every route but the upload route (a
  name at the start of a JSON string, or after ``/file=`` in an address); a path a client
  sends in full still works (the file checks of :mod:`vit_demo.app.server.guard` decide, as before);
- files themselves (the file route's answers) go as they are; only its error texts are rewritten.

Given Gradio's ``release`` (``6.31.0``), it also says only the major version (``6``) where the
exact one was: the config's ``"version"`` (``/config``, the page; gradio_client needs a version
above 4.29, and takes the app for Gradio 2 without one) and the class name the page's CSS and JS
build from it (``gradio-container-6-31-0``, in the ``/assets/`` files: both sides rewritten, so
they still match). The assets are always sent whole (a ``Range`` header on them is dropped) so
that no part of one escapes the rewrite. Their file names (a hash of their content) still tell
the build to anyone who compares them with Gradio's releases.

No Gradio here: the app gives the folder and the release.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]

TOKEN = "files/"  # what a client sees in place of the folder's path
FILE_ROUTES = ("/gradio_api/file=", "/gradio_api/file/")
UPLOAD_ROUTE = "/gradio_api/upload"
ASSETS = "/assets/"  # the page's CSS and JS
TEXTUAL = (b"application/json", b"text/html", b"text/plain", b"text/event-stream")
SCRIPTS = (b"text/css", b"text/javascript", b"application/javascript")  # rewritten for the release only


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    return next((v for k, v in headers if k.lower() == name), None)


def _held(data: bytes, needles: list[bytes]) -> int:
    """How many bytes at the end of ``data`` could be the start of a needle (kept for the next chunk)."""
    for k in range(min(len(data), max(len(n) for n in needles) - 1), 0, -1):
        if any(data.endswith(n[:k]) for n in needles if k < len(n)):
            return k
    return 0


def release_swaps(release: str | None) -> dict[str, list[tuple[bytes, bytes]]]:
    """What names Gradio's exact ``release``, each with the major version in its place: in JSON
    and HTML (``"6.31.0"``, a string of its own) and in CSS and JS (``6-31-0``); nothing without
    a release."""
    if not release:
        return {"text": [], "script": []}
    major = release.split(".")[0]
    return {"text": [(f'"{release}"'.encode(), f'"{major}"'.encode())],
            "script": [(release.replace(".", "-").encode(), major.encode())]}


class PathMask:
    """The ASGI middleware of the module docstring, for the files under ``folder`` (and Gradio's
    ``release``, when given)."""

    def __init__(self, app: Any, folder: str | os.PathLike, token: str = TOKEN, release: str | None = None) -> None:
        self.app = app
        given = os.path.abspath(os.fspath(folder)).rstrip(os.sep) + os.sep
        forms = {given, os.path.realpath(given).rstrip(os.sep) + os.sep}
        forms |= {urllib.parse.quote(f, safe="/") for f in forms}
        self.forms = sorted((f.encode() for f in forms), key=len, reverse=True)  # the longest first
        self.real, self.token = given.encode(), token.encode()
        self.swaps = release_swaps(release)
        self.needles = self.forms + [old for pairs in self.swaps.values() for old, _ in pairs]

    def hide(self, data: bytes, script: bool = False) -> bytes:
        """``data`` with the folder's path replaced by the token and the release by its major
        version (``script``: CSS or JS, where only the release is rewritten)."""
        if not script:
            for form in self.forms:
                data = data.replace(form, self.token)
        for old, new in self.swaps["script" if script else "text"]:
            data = data.replace(old, new)
        return data

    def reveal(self, data: bytes) -> bytes:
        """``data`` with the token put back where a file's name starts (a JSON string, an address)."""
        for lead in (b'"', b"/file="):
            data = data.replace(lead + self.token, lead + self.real)
        return data

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        route = next((r for r in FILE_ROUTES if path.startswith(r)), None)
        if route is not None:
            rest = path[len(route):]
            if rest.startswith(self.token.decode()):
                real = route + self.real.decode() + rest[len(self.token):]
                scope = {**scope, "path": real, "raw_path": urllib.parse.quote(real, safe="/=").encode()}
            return await self.app(scope, receive, self.outgoing(send, errors_only=True))
        if path.startswith(ASSETS) and self.swaps["script"]:  # sent whole, so that all of it is rewritten
            headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in (b"range", b"if-range")]
            return await self.app({**scope, "headers": headers}, receive, self.outgoing(send, scripts=True))
        if path.rstrip("/") != UPLOAD_ROUTE:  # an upload's body is the user's file: as it is
            receive = self.incoming(receive)
        return await self.app(scope, receive, self.outgoing(send))

    def incoming(self, receive: Receive) -> Receive:
        """A receive whose request bodies name files by their real paths (the gate hands each body
        over in one piece)."""
        async def wrapped() -> dict:
            message = await receive()
            if message.get("type") == "http.request" and message.get("body"):
                message = {**message, "body": self.reveal(message["body"])}
            return message

        return wrapped

    def outgoing(self, send: Send, errors_only: bool = False, scripts: bool = False) -> Send:
        """A send that hides the folder in textual responses (``errors_only``: in error responses
        only; ``scripts``: the release in CSS and JS too). A response of known length is rewritten
        whole (its length follows); a stream chunk by chunk, holding back a chunk's end that may be
        the start of the folder's path."""
        state: dict[str, Any] = {"on": False, "start": None, "body": b"", "carry": b""}

        async def wrapped(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = message.get("headers", [])
                kind = (_header(headers, b"content-type") or b"").split(b";")[0].strip().lower()
                state["script"] = scripts and kind in SCRIPTS
                state["on"] = ((kind in TEXTUAL or state["script"]) and _header(headers, b"content-encoding") is None
                               and (not errors_only or message.get("status", 200) >= 400))
                state["sized"] = _header(headers, b"content-length") is not None
                if state["on"] and state["sized"]:
                    state["start"] = message
                    return None
                return await send(message)
            if message["type"] != "http.response.body" or not state["on"]:
                return await send(message)
            more = message.get("more_body", False)
            if state["sized"]:
                state["body"] += message.get("body", b"")
                if more:
                    return None
                body = self.hide(state["body"], state["script"])
                start = dict(state["start"])
                start["headers"] = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
                start["headers"].append((b"content-length", str(len(body)).encode()))
                await send(start)
                return await send({"type": "http.response.body", "body": body, "more_body": False})
            data = self.hide(state["carry"] + message.get("body", b""), state["script"])
            keep = _held(data, self.needles) if more else 0
            state["carry"] = data[len(data) - keep:] if keep else b""
            return await send({**message, "body": data[:len(data) - keep]})

        return wrapped
