"""The REST routes under ``/api/v1``: create, get, list and delete
sandboxes, their status, error context, logs and gateway auth."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from .gateway import gateway_auth
from .refusals import Refused
from .registry import PrimeServer
from .sandbox import TERMINAL, PrimeSandbox

__all__ = ["API", "SandboxRoutes"]

API = "/api/v1"
"""Where the REST API is served."""


class SandboxRoutes:
    """The REST handlers, over the sandboxes of one PrimeServer."""

    def __init__(self, server: PrimeServer) -> None:
        self.server = server

    def register(self, router: web.UrlDispatcher) -> None:
        """Adds the REST routes to ``router``."""
        router.add_post(f"{API}/sandbox", self.create)
        router.add_get(f"{API}/sandbox", self.list)
        router.add_delete(f"{API}/sandbox", self.bulk_delete)
        router.add_post(f"{API}/sandbox/status:batchGet", self.status_batch)
        router.add_get(API + "/sandbox/{sandbox_id}", self.get)
        router.add_delete(API + "/sandbox/{sandbox_id}", self.delete)
        router.add_post(API + "/sandbox/{sandbox_id}/auth", self.auth)
        router.add_get(API + "/sandbox/{sandbox_id}/error-context", self.error_context)
        router.add_get(API + "/sandbox/{sandbox_id}/logs", self.logs)

    def _box(self, request: web.Request) -> PrimeSandbox:
        box = self.server.find(request.match_info["sandbox_id"])
        if box is None:
            raise Refused(404, "Sandbox not found")
        return box

    async def create(self, request: web.Request) -> web.Response:
        """``POST /sandbox``: a PENDING sandbox, its lease acquired behind it."""
        body = await _json(request)
        key = body.get("idempotency_key")
        if isinstance(key, str) and (earlier := self.server.for_idempotency_key(key)) is not None:
            return web.json_response(earlier.to_json())
        for refused, why in [
            ("checkpoint_id", "checkpoints are not kept here; create from docker_image"),
            ("start_command", "a start command is not run here; run it with execute_command"),
            ("volumes", "volumes are not mounted here"),
            ("network_allowlist", "sandboxes here have no network, so no allow-list can be served"),
        ]:
            if body.get(refused):
                raise Refused(422, f"{refused}: {why}")
        if body.get("gpu_count"):
            raise Refused(422, "gpu_count: no GPUs here")
        image, name = body.get("docker_image"), body.get("name")
        if not isinstance(image, str) or not image:
            raise Refused(422, "docker_image is required")
        if not isinstance(name, str):
            raise Refused(422, "name is required")
        labels = body.get("labels") or []
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise Refused(422, "labels must be a list of strings")
        timeout_minutes = body.get("timeout_minutes", 60)
        idle = body.get("idle_timeout_minutes")
        if not isinstance(timeout_minutes, int) or (idle is not None and not isinstance(idle, int)):
            raise Refused(422, "timeout_minutes and idle_timeout_minutes are whole minutes")
        shown = _str_map(body, "environment_vars")
        box = PrimeSandbox(
            id="sbx-" + secrets.token_hex(10),
            name=name,
            image=image,
            cpu_cores=_number(body, "cpu_cores", 1.0),
            memory_gb=_number(body, "memory_gb", 1.0),
            disk_size_gb=_number(body, "disk_size_gb", 5.0),
            timeout_minutes=timeout_minutes,
            idle_timeout_minutes=idle,
            env={**shown, **_str_map(body, "secrets")},
            shown_env=shown,
            labels=list(labels),
            token="",
        )
        self.server.add(box, key if isinstance(key, str) else None)
        return web.json_response({**box.to_json(), "gatewayAuth": gateway_auth(self.server, request, box)})

    async def get(self, request: web.Request) -> web.Response:
        """``GET /sandbox/{id}``."""
        return web.json_response(self._box(request).to_json())

    async def list(self, request: web.Request) -> web.Response:
        """``GET /sandbox``: a page of sandboxes, filtered by labels and status."""
        q = request.query
        try:
            page, per_page = max(1, int(q.get("page", "1"))), max(1, min(1000, int(q.get("per_page", "50"))))
        except ValueError:
            raise Refused(422, "page and per_page are numbers") from None
        wanted = set(q.getall("labels", []))
        status = q.get("status")
        active = q.get("is_active", "").lower() == "true"
        boxes = [
            b
            for b in sorted(self.server.sandboxes(), key=lambda b: b.created_at, reverse=True)
            if wanted <= set(b.labels)
            and (status is None or b.status == status)
            and not (active and b.status in TERMINAL)
        ]
        chunk = boxes[(page - 1) * per_page : page * per_page]
        return web.json_response(
            {
                "sandboxes": [b.to_json() for b in chunk],
                "total": len(boxes),
                "page": page,
                "perPage": per_page,
                "hasNext": page * per_page < len(boxes),
            }
        )

    async def delete(self, request: web.Request) -> web.Response:
        """``DELETE /sandbox/{id}``: ends it, releasing its lease."""
        box = self._box(request)
        await self.server.end(box, "TERMINATED", None, None, "deleted")
        return web.json_response({"success": True, "message": f"Sandbox {box.id} deleted"})

    async def bulk_delete(self, request: web.Request) -> web.Response:
        """``DELETE /sandbox``: ends the sandboxes given by ids or labels."""
        body = await _json(request)
        ids, labels = body.get("sandbox_ids"), body.get("labels")
        if not ids and not labels:
            raise Refused(422, "give sandbox_ids or labels")
        chosen: list[str] = []
        if isinstance(ids, list):
            chosen += [i for i in ids if isinstance(i, str)]
        if isinstance(labels, list):
            wanted = {x for x in labels if isinstance(x, str)}
            chosen += [
                b.id for b in self.server.sandboxes() if wanted <= set(b.labels) and b.status not in TERMINAL
            ]
        succeeded, failed = [], []
        for sandbox_id in dict.fromkeys(chosen):
            box = self.server.find(sandbox_id)
            if box is None:
                failed.append({"sandbox_id": sandbox_id, "error": "Sandbox not found"})
                continue
            await self.server.end(box, "TERMINATED", None, None, "deleted")
            succeeded.append(sandbox_id)
        return web.json_response(
            {"succeeded": succeeded, "failed": failed, "message": f"Deleted {len(succeeded)} sandbox(es)"}
        )

    async def status_batch(self, request: web.Request) -> web.Response:
        """``POST /sandbox/status:batchGet``: the statuses of the ids given."""
        body = await _json(request)
        ids = body.get("sandbox_ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise Refused(422, "sandbox_ids must be a list of ids")
        statuses, missing = [], []
        for sandbox_id in ids:
            box = self.server.find(sandbox_id)
            if box is None:
                missing.append(
                    {"sandbox_id": sandbox_id, "code": "NOT_FOUND", "message": "Sandbox not found"}
                )
            else:
                statuses.append(
                    {
                        "sandbox_id": box.id,
                        "status": box.status,
                        "error_type": box.error_type,
                        "error_message": box.error_message,
                    }
                )
        return web.json_response({"statuses": statuses, "errors": missing})

    async def error_context(self, request: web.Request) -> web.Response:
        """``GET /sandbox/{id}/error-context``: its status and error."""
        box = self._box(request)
        return web.json_response(
            {"status": box.status, "errorType": box.error_type, "errorMessage": box.error_message}
        )

    async def logs(self, request: web.Request) -> web.Response:
        """``GET /sandbox/{id}/logs``: empty (no start command runs here)."""
        self._box(request)
        return web.json_response({"logs": ""})

    async def auth(self, request: web.Request) -> web.Response:
        """``POST /sandbox/{id}/auth``: the gateway's URL and its token."""
        return web.json_response(gateway_auth(self.server, request, self._box(request)))


def _str_map(body: Mapping[str, Any], key: str) -> dict[str, str]:
    value = body.get(key) or {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise Refused(422, f"{key} must map names to strings")
    return dict(value)


def _number(body: Mapping[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise Refused(422, f"{key} must be a positive number")
    return float(value)


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise Refused(422, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise Refused(422, "the body must be a JSON object")
    return body
