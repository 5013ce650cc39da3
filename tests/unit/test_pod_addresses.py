"""The Pod cache's address index (sandboxd.backends.kubernetes.cache), which
the model gateway tells a call's sandbox by: a Pod's address is its own only
while it has it, not once it is being deleted, and a reused address is the
new Pod's."""

from __future__ import annotations

from typing import Any

import pytest

from sandboxd.backends.kubernetes.cache import PodCache

pytestmark = pytest.mark.timeout(10)


def _pod(name: str, ip: str = "", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "resourceVersion": "1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    return {"metadata": meta, "status": {"phase": "Running", "podIP": ip}}


def test_an_address_is_its_pods_while_the_pod_has_it() -> None:
    cache = PodCache(client=None, namespace="ns", label_selector="x")  # type: ignore[arg-type]
    assert cache.at("10.0.0.5") is None
    cache._apply({"type": "ADDED", "object": _pod("a")})
    assert cache.at("10.0.0.5") is None
    cache._apply({"type": "MODIFIED", "object": _pod("a", "10.0.0.5")})
    found = cache.at("10.0.0.5")
    assert found is not None and found.name == "a"
    # Being deleted: its address may already be handed to another Pod.
    cache._apply({"type": "MODIFIED", "object": _pod("a", "10.0.0.5", deleting=True)})
    assert cache.at("10.0.0.5") is None
    # Reused by b before a's deletion is seen: b's; a's deletion leaves b's entry.
    cache._apply({"type": "ADDED", "object": _pod("b", "10.0.0.5")})
    cache._apply({"type": "DELETED", "object": _pod("a", "10.0.0.5", deleting=True)})
    found = cache.at("10.0.0.5")
    assert found is not None and found.name == "b"
    cache._apply({"type": "DELETED", "object": _pod("b", "10.0.0.5")})
    assert cache.at("10.0.0.5") is None and not cache._at
