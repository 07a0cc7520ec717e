"""ASGI middleware: answer 413 to a request body over ``BodyLimit.max_bytes``.

A declared ``Content-Length`` over the limit is refused before reading; a body sent
without one (chunked) is counted while it streams and refused once it passes the
limit, before the endpoint sees any of it.
"""

from __future__ import annotations

import json
from typing import Any

Scope = dict[str, Any]


class BodyLimit:
    max_bytes: int = 2_000_000  # set per replica from ServiceConfig.max_body_bytes

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = type(self).max_bytes
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await _refuse(send, limit)
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                await _refuse(send, limit)
                return
            chunks.append(body)
            more = message.get("more_body", False)
        buffered = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return buffered
            return await receive()

        await self.app(scope, replay, send)


async def _refuse(send: Any, limit: int) -> None:
    body = json.dumps({"error": f"request body larger than {limit} bytes",
                       "errors": [{"field": "body", "message": "too large"}]}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
