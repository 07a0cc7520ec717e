"""ASGI guards in front of the decision service's routes: methods, then authentication.

* :class:`AllowedMethods`: ``OPTIONS`` on any route answers 204 with an ``Allow`` header
  listing every method the path takes (a path served by a GET and a POST route lists
  both), and a method the path does not take answers 405 with the same ``Allow`` header.
* :class:`BearerAuth`: a request to a protected (path, method) without the right bearer
  token answers 401 before its body is read or validated, so an unauthenticated client
  learns nothing about a protected endpoint's schema from 422s.

Both answer in the service's error format (``{"error": ..., "errors": [...]}``). Their
settings are class attributes, set by each replica from its ``ServiceConfig`` (one
replica per process), like ``BodyLimit.max_bytes``.
"""

from __future__ import annotations

import hmac
import json
from typing import Any, ClassVar

from starlette.routing import Match

Scope = dict[str, Any]
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


async def send_error(send: Any, status: int, field: str, message: str,
                     headers: dict[str, str] | None = None) -> None:
    """One error response in the service's format."""
    body = json.dumps({"error": message, "errors": [{"field": field,
                                                     "message": message}]}).encode()
    raw = [(b"content-type", b"application/json"),
           (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def allowed_methods(routes: list[Any], scope: Scope) -> list[str]:
    """Every method some route takes at ``scope``'s path (HEAD with GET), in METHODS order."""
    found = []
    for method in METHODS:
        probe = {**scope, "method": method}
        if any(route.matches(probe)[0] == Match.FULL for route in routes):
            found.append(method)
    return found


class AllowedMethods:
    """OPTIONS and 405 answers whose ``Allow`` lists every method of the path.

    ``routes_of`` returns the app's top-level routes (nested routers included through
    their own ``matches``)."""

    def __init__(self, app: Any, routes_of: Any) -> None:
        self.app = app
        self.routes_of = routes_of

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        methods = allowed_methods(self.routes_of(), scope)
        method = scope["method"]
        if not methods or (method in methods and method != "OPTIONS"):
            await self.app(scope, receive, send)
            return
        allow = ", ".join([*methods, "OPTIONS"])
        if method == "OPTIONS":
            await send({"type": "http.response.start", "status": 204,
                        "headers": [(b"allow", allow.encode()), (b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        await send_error(send, 405, "method", f"method {method} not allowed on "
                         f"{scope['path']}; allowed: {allow}", {"Allow": allow})


class BearerAuth:
    """401 for a protected (path, method) without the right ``Authorization: Bearer``."""

    token: ClassVar[str | None] = None
    protected: ClassVar[dict[str, frozenset[str]]] = {}  # path -> methods that need it

    def __init__(self, app: Any) -> None:
        self.app = app

    @classmethod
    def configure(cls, token: str | None, protected: dict[str, frozenset[str]]) -> None:
        cls.token, cls.protected = token, dict(protected)

    @classmethod
    def authorized(cls, header: str) -> bool:
        scheme, _, given = header.partition(" ")
        return bool(cls.token) and scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), (cls.token or "").encode())

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        needs = type(self).protected.get(scope.get("path", "")) if scope["type"] == "http" \
            else None
        if not needs or scope["method"] not in needs:
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers") or []).get(b"authorization", b"")
        if type(self).authorized(header.decode("latin-1")):
            await self.app(scope, receive, send)
            return
        message = ("this endpoint needs a bearer token: set auth_token in the service "
                   "config or CLOUDRL_SERVE_TOKEN") if not type(self).token \
            else "missing or wrong bearer token"
        await send_error(send, 401, "authorization", message, {"WWW-Authenticate": "Bearer"})
