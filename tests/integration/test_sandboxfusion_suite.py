"""SandboxFusion's own tests (its runner tests and the dataset tests that post
to ``/run_code``, ported in benchmarks.runcode_sf) replayed against
``sandboxd run-code`` on the real engine and the code-judge image, one at a
time and eight at once: every one passes, or is listed with why it cannot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import docker
import pytest
import pytest_asyncio

# SandboxFusion's bare asserts say what they compared.
pytest.register_assert_rewrite("benchmarks.runcode_sf.ported")

from benchmarks.runcode_sf import NEEDS_NETWORK, Case, cases, replay, run_case, set_endpoint  # noqa: E402
from tests.integration.runcode_endpoint import judge_endpoint  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180)]

CASES = cases()
# Languages whose toolchain no registry reachable at build time ships for
# bookworm (sandboxd.adapters.sandboxfusion_langs.UNPACKAGED): run-code answers
# them SandboxError naming the missing tool, which their tests cannot pass.
UNAVAILABLE = ("sf_julia::", "sf_swift::", "sf_lean::")


def _expected_to_fail(case: Case) -> str:
    if case.name in NEEDS_NETWORK:
        return "reaches the internet; run-code's sandboxes have no network"
    if case.name.startswith(UNAVAILABLE):
        return "the code-judge image has no toolchain for this language"
    return ""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def endpoint(
    tmp_path_factory: pytest.TempPathFactory, engine: docker.DockerClient
) -> AsyncIterator[str]:
    async with judge_endpoint(tmp_path_factory.mktemp("sfsuite"), engine, "sfsuite") as url:
        set_endpoint(url)
        yield url


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_sandboxfusion_case(case: Case, endpoint: str) -> None:
    outcome = await asyncio.to_thread(run_case, case)
    why = _expected_to_fail(case)
    if why:
        # Never skipped silently: such a case passing means the reason is gone.
        assert not outcome.passed, f"{case.name} passes, but is listed as unable to: {why}"
        return
    assert outcome.passed, f"{case.name}: {outcome.error}"


@pytest.mark.timeout(900)
async def test_sandboxfusion_suite_eight_at_once(endpoint: str) -> None:
    """Eight requests at once answer as one at a time: every case passes. run-code runs
    at most as many programs at once as the host has CPUs, and a queued request's time
    limits start only once it runs, so a crowded host costs latency, never a time-out."""
    expected = [c for c in CASES if not _expected_to_fail(c)]
    outcomes = await replay(expected, concurrency=8)
    failed = [f"{o.name}{' (timed out)' if o.timed_out else ''}: {o.error}" for o in outcomes if not o.passed]
    assert not failed, "\n".join(failed)
