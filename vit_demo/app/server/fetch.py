"""A picture fetched from a public web address, for a local app's MCP tools (never when exposed).

:func:`fetch_picture` resolves the name once, refuses it unless every address it has is a public
one (no loopback, private, link-local or reserved address: nothing on this machine's network),
connects to that address (so that a second resolution cannot point elsewhere), follows no
redirect, and reads at most ``max_bytes`` (the app's ``--max-upload-mb``). No Gradio here.
"""

from __future__ import annotations

import base64
import ipaddress
import socket
from collections.abc import Callable

import httpx

TIMEOUT_S = 10.0


class FetchRefused(ValueError):
    """A URL the app will not fetch, or whose answer it will not take (one plain line)."""


def public_address(host: str) -> str:
    """The address to connect to for ``host``, if every address it resolves to is public."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise FetchRefused(f"cannot resolve {host[:60]}") from e
    addrs = [info[4][0] for info in infos]
    if not addrs or not all(ipaddress.ip_address(a.split("%")[0]).is_global for a in addrs):
        raise FetchRefused("only pictures on public web addresses are fetched (not this computer's network)")
    return addrs[0]


class PinnedTransport(httpx.HTTPTransport):
    """Connects to one checked address, the name kept for the Host header and TLS."""

    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        request.url = request.url.copy_with(host=self.address)
        request.headers["Host"] = host
        request.extensions = {**request.extensions, "sni_hostname": host}
        return super().handle_request(request)


def fetch_picture(url: str, max_bytes: int, resolve: Callable[[str], str] = public_address) -> str:
    """The picture at ``url`` (http or https, a public host) as a base64 data URL, or
    :class:`FetchRefused`: another scheme, a private address, a redirect, an error status, more
    than ``max_bytes``. ``resolve``: the name -> the address to connect to (the tests' own
    server is on this computer, which :func:`public_address` refuses)."""
    try:
        u = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as e:
        raise FetchRefused("not a valid URL") from e
    if u.scheme not in ("http", "https") or not u.host:
        raise FetchRefused("only http and https URLs are fetched")
    with httpx.Client(transport=PinnedTransport(resolve(u.host)), timeout=TIMEOUT_S,
                      follow_redirects=False) as client, client.stream("GET", u) as r:
        if r.status_code != 200:
            raise FetchRefused(f"the address answered {r.status_code}, not a picture")
        declared = r.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise FetchRefused(f"the picture is larger than {max_bytes >> 20} MB")
        chunks, n = [], 0
        for chunk in r.iter_bytes():
            n += len(chunk)
            if n > max_bytes:
                raise FetchRefused(f"the picture is larger than {max_bytes >> 20} MB")
            chunks.append(chunk)
        mime = r.headers.get("content-type", "").split(";")[0].strip()
    mime = mime if mime.startswith("image/") and len(mime) < 40 else "image/png"
    return f"data:{mime};base64,{base64.b64encode(b''.join(chunks)).decode()}"
