"""A plain JSON-RPC client of an MCP server over Streamable HTTP (no Gradio, no MCP library).

    tools = McpClient("http://127.0.0.1:PORT/gradio_api/mcp/").call("tools/list")["tools"]

Each request is one POST of a JSON-RPC message; the answer comes as JSON or as a short
server-sent event stream whose ``data:`` line holds it. Used by the MCP tests and
``benchmarks/bench_attacks.py``.
"""

from __future__ import annotations

import base64
import io
import itertools
import json
from typing import Any

import httpx

PROTOCOL = "2025-06-18"


class McpError(RuntimeError):
    """A JSON-RPC error answer (``code``, ``message``)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class McpClient:
    def __init__(self, url: str, timeout: float = 120.0, headers: dict[str, str] | None = None,
                 source: str | None = None) -> None:
        self.url = url
        transport = httpx.HTTPTransport(local_address=source) if source else None  # another loopback address
        self.http = httpx.Client(timeout=timeout, transport=transport, headers={
            "accept": "application/json, text/event-stream", "content-type": "application/json",
            "mcp-protocol-version": PROTOCOL, **(headers or {})})
        self.ids = itertools.count(1)

    def post(self, method: str, params: dict | None = None) -> httpx.Response:
        """One JSON-RPC request, the raw HTTP answer."""
        msg = {"jsonrpc": "2.0", "id": next(self.ids), "method": method, "params": params or {}}
        return self.http.post(self.url, content=json.dumps(msg))

    def call(self, method: str, params: dict | None = None) -> dict:
        """The ``result`` of one JSON-RPC request (:class:`McpError` for an ``error`` answer)."""
        r = self.post(method, params)
        r.raise_for_status()
        answer = parse(r)
        if "error" in answer:
            raise McpError(answer["error"].get("code", 0), answer["error"].get("message", ""))
        return answer["result"]

    def initialize(self) -> dict:
        return self.call("initialize", {"protocolVersion": PROTOCOL, "capabilities": {},
                                        "clientInfo": {"name": "plain-json-rpc", "version": "0"}})

    def tool(self, name: str, **arguments: Any) -> dict:
        """A ``tools/call`` result: ``content`` (text and image items) and ``isError``."""
        return self.call("tools/call", {"name": name, "arguments": arguments})

    def close(self) -> None:
        self.http.close()


def parse(r: httpx.Response) -> dict:
    """The JSON-RPC answer of an HTTP response: the JSON body, or the last ``data:`` event."""
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
        return json.loads(data[-1])
    return r.json()


def data_url(path_or_bytes: Any, mime: str = "image/jpeg") -> str:
    """A picture file (or its bytes) as a base64 data URL."""
    raw = path_or_bytes if isinstance(path_or_bytes, bytes) else open(path_or_bytes, "rb").read()
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


def texts(result: dict) -> list[str]:
    return [c["text"] for c in result.get("content", []) if c.get("type") == "text"]


def images(result: dict) -> list[bytes]:
    return [base64.b64decode(c["data"]) for c in result.get("content", []) if c.get("type") == "image"]


def first_json(result: dict) -> Any:
    """The first text item that is JSON (a tool's dict answer), parsed."""
    for t in texts(result):
        try:
            return json.loads(t)
        except ValueError:
            try:
                import ast

                return ast.literal_eval(t)
            except (ValueError, SyntaxError):
                continue
    raise ValueError(f"no JSON among {texts(result)!r}")


def jpeg_bytes(img: Any, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return buf.getvalue()
