"""What the metered model gateway adds to a chat completion, for benchmarks.network.

The same chat completion, one after another, against the fake
OpenAI-compatible server (tests.fake_model): from a sandbox namespace through
its gateway (sandboxd.backends.network.gateway, keyed to a real lease table,
recording every call), and from a host process straight to the server,
alternated so that both meet the same background load.
"""

from __future__ import annotations

import http.client
import json
import statistics
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from sandboxd.backends.network import netns
from sandboxd.clock import SystemClock
from sandboxd.core.leases import Lease, LeaseTable
from sandboxd.core.model_route import ModelLedger, ModelRoute

BODY = json.dumps(
    {"model": "policy", "messages": [{"role": "user", "content": "hello"}], "logprobs": True}
).encode()


def route_for(sandbox_id: str, upstream: str) -> tuple[ModelRoute, str]:
    """A route whose one lease holds ``sandbox_id``, and that lease's key."""
    leases = LeaseTable()
    leases.add(Lease("ls-bench", "bench", [sandbox_id], 3600.0, float("inf"), float("inf")), {})
    route = ModelRoute(leases, lambda _: upstream, ModelLedger(SystemClock()))
    return route, route.key_for("ls-bench", "bench", sandbox_id)


def one_chat(url: str, key: str) -> float:
    """Seconds for one chat completion (a connection of its own, as an agent's client may open)."""
    parts = urlsplit(url)
    began = time.perf_counter()
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=30)
    try:
        conn.request(
            "POST",
            parts.path + "/chat/completions",
            body=BODY,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        answer = conn.getresponse()
        data = answer.read()
        if answer.status != 200 or b"choices" not in data:
            raise RuntimeError(f"chat completion through {url}: {answer.status} {data[:200]!r}")
    finally:
        conn.close()
    return time.perf_counter() - began


def compare(n: int, upstream: str, key: str, in_box: Callable[[Callable[[], Any]], Any]) -> dict[str, Any]:
    """``n`` chats each way, alternated; blocking (run it on a thread)."""
    gateway_url = f"http://{netns.EGRESS_ADDRESS}:{netns.MODEL_PORT}/v1"
    direct: list[float] = []
    through: list[float] = []
    for _ in range(n):
        direct.append(one_chat(upstream, ""))
        through.append(in_box(lambda: one_chat(gateway_url, key)))
    direct_ms = statistics.median(direct) * 1000
    through_ms = statistics.median(through) * 1000
    return {
        "chats": n,
        "direct_p50_ms": round(direct_ms, 3),
        "gateway_p50_ms": round(through_ms, 3),
        "overhead_p50_ms": round(through_ms - direct_ms, 3),
    }
