"""The Docker backend's image list while the engine's disk-usage view is
busy with another caller's computation: it asks again, and past a few tries
lists images with each counted in full (never less than the truth); callers
at once share one listing."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import docker.errors
import pytest

from sandboxd.backends.docker import images
from sandboxd.backends.docker.images import DockerImages, classify
from sandboxd.errors import FailedPrecondition, TransientBackendError, Unavailable
from tests.unit.conftest import wait_for

ENTRY = {
    "Id": "sha256:1",
    "RepoTags": ["reg/a:1"],
    "RepoDigests": ["reg/a@sha256:2"],
    "Size": 100,
    "SharedSize": 40,
}


class Api:
    def __init__(self, busy: int, error: str = "a disk usage operation is already running") -> None:
        self.busy = busy
        self.error = error
        self.df_calls = 0
        self.gate = threading.Event()
        self.gate.set()

    def df(self) -> dict[str, Any]:
        self.df_calls += 1
        self.gate.wait(timeout=60)
        if self.busy:
            self.busy -= 1
            raise docker.errors.APIError("500 Server Error", explanation=self.error)
        return {"Images": [ENTRY]}

    def images(self) -> list[dict[str, Any]]:
        return [{**ENTRY, "RepoDigests": None, "SharedSize": -1}]


def store(api: Api) -> DockerImages:
    s = DockerImages()
    s._init_images(api)
    return s


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "_DF_FIRST_PAUSE", 0.001)


async def test_a_busy_disk_usage_view_is_asked_again() -> None:
    api = Api(busy=2)
    s = store(api)
    try:
        [found] = await s.list_images()
        assert api.df_calls == 3
        assert (found.size_bytes, found.shared_bytes) == (100, 40)
        assert found.references == ("reg/a:1", "reg/a@sha256:2")
    finally:
        s._close_images()


async def test_past_a_few_tries_images_count_in_full() -> None:
    api = Api(busy=1000)
    s = store(api)
    try:
        [found] = await s.list_images()
        assert api.df_calls == images._DF_TRIES
        assert (found.size_bytes, found.shared_bytes) == (100, 0)
    finally:
        s._close_images()


async def test_callers_at_once_share_one_disk_usage_computation() -> None:
    api = Api(busy=0)
    api.gate.clear()
    s = store(api)
    try:
        callers = [asyncio.create_task(s.list_images()) for _ in range(5)]
        await wait_for(lambda: api.df_calls == 1, what="the first listing under way")
        callers[0].cancel()  # one giving up leaves the listing to the others
        api.gate.set()
        results = await asyncio.gather(*callers[1:])
        assert api.df_calls == 1
        assert all(r == results[0] and len(r) == 1 for r in results)
        # One that ended is not handed out again: a later caller lists anew.
        await s.list_images()
        assert api.df_calls == 2
    finally:
        api.gate.set()
        s._close_images()


async def test_another_engine_error_is_transient() -> None:
    s = store(Api(busy=1, error="something else"))
    try:
        with pytest.raises(TransientBackendError, match="cannot list images"):
            await s.list_images()
    finally:
        s._close_images()


def test_pull_refusals_are_typed() -> None:
    ref = "127.0.0.1:5000/a:1"
    assert isinstance(classify(ref, "manifest for x not found: manifest unknown"), FailedPrecondition)
    assert isinstance(classify(ref, "unauthorized: authentication required"), FailedPrecondition)
    assert isinstance(
        classify(ref, 'Get "http://127.0.0.1:1/v2/": dial tcp: connect: connection refused'), Unavailable
    )
    assert type(classify(ref, "write /var/lib/docker: no space left on device")) is TransientBackendError
