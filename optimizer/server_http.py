"""The few HTTP calls kvtune makes to a serving engine (standard library only): a GET that returns the status, the
headers and the JSON body, and the server root of a ``.../v1`` URL."""

from __future__ import annotations

import http.client
import json
import socket
import urllib.parse
from typing import Any

__all__ = ["get", "get_json", "root_of", "reason", "Unreachable", "ServerRoot"]


class Unreachable(OSError):
    """Nothing answered (refused, timed out, reset)."""


class ServerRoot(str):
    """A server root URL that carries the headers every request to it sends (``Authorization:
    Bearer`` for a server started with ``--api-key`` or a gateway). A ``str``, so the engine
    kinds' calls pass it through to :func:`get` unchanged; ``repr`` shows the URL, never the key."""

    headers: dict[str, str]

    def __new__(cls, url: str, api_key: str | None = None) -> "ServerRoot":
        self = super().__new__(cls, url)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        return self

    def __repr__(self) -> str:
        return repr(str(self))


def root_of(url: str) -> str:
    """``http://host:port`` (plus any path prefix) of ``url``, without a trailing ``/v1``."""
    u = urllib.parse.urlsplit(url)
    path = u.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return f"{u.scheme}://{u.netloc}{path}"


def reason(exc: BaseException) -> str:
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def get(root: str, path: str, timeout_s: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    """GET ``root + path``; raises ``Unreachable`` when no HTTP answer comes."""
    u = urllib.parse.urlsplit(root)
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    c = cls(u.hostname or "", u.port or (443 if u.scheme == "https" else 80), timeout=timeout_s)
    try:
        c.request("GET", u.path.rstrip("/") + path, headers=getattr(root, "headers", {}))
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    except (OSError, http.client.HTTPException) as exc:
        raise Unreachable(reason(exc)) from None
    finally:
        c.close()


def get_json(root: str, path: str, timeout_s: float = 5.0) -> tuple[int, Any]:
    """(status, parsed JSON or None) of a GET; ``Unreachable`` when nothing answers."""
    status, _, body = get(root, path, timeout_s)
    try:
        return status, json.loads(body) if body else None
    except ValueError:
        return status, None
