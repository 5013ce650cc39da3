"""E2B's metrics routes (``GET /sandboxes/{id}/metrics`` and
``GET /sandboxes/metrics?sandbox_ids=``) over samples of sandboxd's usage
(sandboxd.e2b.usage says what a sample holds and what is kept)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from sandboxd.e2b.control import Control, Refused, of_running, running_sandbox
from sandboxd.e2b.registry import RUNNING, Box, now
from sandboxd.e2b.usage import sample

__all__ = ["get_metrics", "get_metrics_of"]


def _unix(request: web.Request, name: str) -> int | None:
    raw = request.query.get(name, "")
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError as e:
        raise Refused(400, f"{name} must be a time in unix seconds, got {raw[:40]!r}") from e


async def _sampled(control: Control, box: Box) -> None:
    """A metrics sample of the box's sandbox taken now and kept."""
    usage, info = await asyncio.gather(
        of_running(control, box, box.client.usage(box.sandbox_id)), running_sandbox(control, box)
    )
    taken = sample(now(), box.started_at, box.sandbox_id, usage, info.limits, control.samples.last(box.id))
    control.samples.add(box.id, taken)


def _has_sandbox(box: Box) -> bool:
    """Whether a sandboxd sandbox is behind the box now (not one filesystem-paused)."""
    return box.state == RUNNING or box.paused_live


async def get_metrics(control: Control, request: web.Request) -> web.Response:
    """E2B's SandboxMetric list from ``start`` to ``end`` (unix seconds):
    a sample taken now (where ``end`` is not past and the sandbox runs),
    after those earlier calls took (sandboxd.e2b.usage says what is kept)."""
    box = control.box(request)
    start, end = _unix(request, "start"), _unix(request, "end")
    if start is not None and end is not None and start > end:
        raise Refused(400, "start must not be after end")
    control.samples.keep_only(b.id for b in control.registry.all())
    if _has_sandbox(box) and (end is None or end + 1 >= now().timestamp()):
        await _sampled(control, box)
    return web.json_response(control.samples.between(box.id, start, end))


MAX_METRICS_IDS = 100


async def get_metrics_of(control: Control, request: web.Request) -> web.Response:
    """The latest metric of each of ``sandbox_ids`` (comma separated) that
    this key holds and that runs, sampled now: ``{"sandboxes": {id: metric}}``;
    others are left out."""
    key = control.key(request)
    ids = list(dict.fromkeys(i for i in request.query.get("sandbox_ids", "").split(",") if i))
    if not ids or len(ids) > MAX_METRICS_IDS:
        raise Refused(400, f"sandbox_ids must name 1 to {MAX_METRICS_IDS} sandboxes, comma separated")
    boxes = [b for b in (control.registry.get(key, i) for i in ids) if b is not None and _has_sandbox(b)]
    results = await asyncio.gather(*(_sampled(control, b) for b in boxes), return_exceptions=True)
    out: dict[str, Any] = {}
    for box, result in zip(boxes, results, strict=True):
        if isinstance(result, BaseException):
            if isinstance(result, Refused) and result.status == 404:
                continue  # it ended meanwhile
            raise result
        last = control.samples.last(box.id)
        if last is not None:
            out[box.id] = last.metric
    return web.json_response({"sandboxes": out})
