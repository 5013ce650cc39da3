"""Pre-flight: checks a planned run against everything that would make it
fail later (image, limits, quotas, capacity, backend health) and predicts how
long the sandboxes take to warm. Reads only; creates nothing."""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from sandboxd.backends.base import HostCapacity, Limits, TenantQuotas
from sandboxd.core import capacity
from sandboxd.core.control import ControlPlane
from sandboxd.core.lifecycle import State
from sandboxd.core.pools.config import network_refusal
from sandboxd.core.root_setting import root_setting, writable_root
from sandboxd.core.runtimes import fit_limits, runtime_name, runtime_refusal
from sandboxd.core.tenancy import current_tenant
from sandboxd.errors import BackendError, FailedPrecondition, InvalidArgument, Unavailable

# Until a start has been measured, assume what a container start costs on a
# small machine (PRIOR-ART: create+start 155 ms, plus the health check).
DEFAULT_START_SECONDS = 0.5
# CPU limits are ceilings, not reservations: only flag gross oversubscription.
CPU_OVERCOMMIT = 4.0


class ProblemKind(enum.IntEnum):
    """What would make a planned run fail."""

    # Values match sandboxd.v1.ProblemKind.
    IMAGE_MISSING = 1
    LIMITS_INVALID = 2
    QUOTA_TOO_SMALL = 3
    CAPACITY_TOO_SMALL = 4
    BACKEND_UNHEALTHY = 5
    POOL_TOO_SMALL = 6
    LIFETIME_TOO_SHORT = 7
    RUNTIME_UNAVAILABLE = 8
    IMAGE_TOO_LARGE = 9
    NETWORK_UNAVAILABLE = 10
    ROOT_UNAVAILABLE = 11


@dataclass(frozen=True)
class Problem:
    """One thing that would make the run fail, and the field to change."""

    kind: ProblemKind
    message: str
    field: str = ""


@dataclass
class Report:
    """What pre-flight found: problems, capacity and need, predicted warm-up time."""

    problems: list[Problem] = field(default_factory=list)
    memory_bytes: int = 0
    cpus: int = 0
    memory_needed_bytes: int = 0
    cpus_needed: float = 0.0
    predicted_warm_seconds: float = 0.0
    measured_start_seconds: float = 0.0
    quota_sandboxes_left: int | None = None
    """Sandboxes the backend's own quotas still admit for the tenant (None = no such quota)."""
    quota_memory_left_bytes: int | None = None
    host_sandboxes: int = 0
    """Sandboxes of these limits the backend's host is estimated to hold (0 = unknown)."""
    network: list[str] = field(default_factory=list)
    """What the pool's sandboxes may reach (its network rules); empty = no network."""

    @property
    def ok(self) -> bool:
        """Whether nothing stands in the run's way."""
        return not self.problems


async def preflight(
    control: ControlPlane,
    *,
    pool: str | None,
    image: str | None,
    limits: Limits | None,
    concurrent: int,
    duration: float,
    runtime: str = "",
    images: Sequence[str] = (),
) -> Report:
    """Checks a run of ``concurrent`` sandboxes (of ``pool``, or of ``image``,
    ``limits`` and ``runtime``) lasting ``duration`` seconds; ``images`` are
    further images the run's sandboxes take (per-task images), checked like
    ``image``. Reads only, creates nothing."""
    if concurrent < 1:
        raise InvalidArgument("concurrent", f"must be >= 1, got {concurrent}")
    if duration < 0 or math.isnan(duration):
        raise InvalidArgument("expected_duration_seconds", f"must be >= 0, got {duration}")
    report = Report()
    add = report.problems.append
    ready = 0
    max_size = concurrent
    starts: list[float] = []
    model = False
    writable = False
    if pool:
        p = control.get_pool(pool, "pool")
        writable = writable_root(p.config)
        report.network = list(p.config.network)
        model = bool(p.config.model_endpoint)
        image, resolved, runtime = p.config.image, p.config.limits, p.config.runtime
        ready, max_size = p.ready, p.config.max_size
        for rec in p.records.values():
            t0, t1 = rec.entered.get(State.CREATING), rec.entered.get(State.READY)
            if t0 is not None and t1 is not None:
                starts.append(t1 - t0)
        if concurrent > max_size:
            add(
                Problem(
                    ProblemKind.POOL_TOO_SMALL,
                    f"pool {pool!r} holds at most {max_size} sandboxes; raise max_size to {concurrent}",
                    "spec.max_size",
                )
            )
    else:
        if not image:
            raise InvalidArgument("template.image", "is required when no pool is named")
        try:
            resolved = control.resolve_limits(limits or Limits())
        except InvalidArgument as e:
            add(Problem(ProblemKind.LIMITS_INVALID, e.message, e.field.replace("spec.", "template.")))
            resolved = control.resolve_limits(Limits())
        runtime = runtime_name(runtime)
        resolved = fit_limits(runtime, resolved)

    try:
        await control.backend.ping()
        healthy = True
    except BackendError as e:
        healthy = False
        add(Problem(ProblemKind.BACKEND_UNHEALTHY, f"the backend does not answer: {e.message}"))
    if control.reconciler.health.degraded:
        add(Problem(ProblemKind.BACKEND_UNHEALTHY, control.reconciler.health.describe()))
    if healthy:
        report.problems += await image_problems(control, [image, *images])
        refusal = await runtime_refusal(control.backend, runtime, Limits() if pool else (limits or Limits()))
        if refusal is not None:
            add(Problem(ProblemKind.RUNTIME_UNAVAILABLE, refusal, "runtime"))
        blocked = network_refusal(control.backend, runtime, report.network, model)
        if blocked is not None:
            add(Problem(ProblemKind.NETWORK_UNAVAILABLE, blocked, "spec.network"))
        if writable:
            try:
                await root_setting(p.config, control.backend)
            except FailedPrecondition as e:
                add(Problem(ProblemKind.ROOT_UNAVAILABLE, e.message, "spec.root"))
        report.memory_bytes, report.cpus = await control.backend.capacity()
        if isinstance(control.backend, HostCapacity):
            facts = await control.backend.host_facts()
            host = capacity.estimate(facts, resolved, control.settings.pools.memory_overcommit)
            report.host_sandboxes = host.sandboxes
            if host.sandboxes and concurrent > host.sandboxes:
                add(Problem(ProblemKind.CAPACITY_TOO_SMALL, capacity.refusal(concurrent, host), "concurrent"))
        if isinstance(control.backend, TenantQuotas):
            try:
                headroom = await control.backend.quota_headroom(current_tenant())
            except BackendError as e:
                add(Problem(ProblemKind.BACKEND_UNHEALTHY, f"cannot read the backend's quotas: {e.message}"))
            else:
                report.quota_sandboxes_left = headroom.pods
                report.quota_memory_left_bytes = headroom.memory_bytes

    report.memory_needed_bytes = concurrent * resolved.memory_bytes
    report.cpus_needed = concurrent * resolved.cpu_millis / 1000
    if report.memory_bytes and report.memory_needed_bytes > report.memory_bytes:
        fit = report.memory_bytes // max(resolved.memory_bytes, 1)
        add(
            Problem(
                ProblemKind.CAPACITY_TOO_SMALL,
                f"{concurrent} sandboxes of {resolved.memory_bytes} bytes need {report.memory_needed_bytes} "
                f"bytes of memory; the backend has {report.memory_bytes} (about {fit} fit)",
                "concurrent",
            )
        )
    if report.cpus and report.cpus_needed > CPU_OVERCOMMIT * report.cpus:
        add(
            Problem(
                ProblemKind.CAPACITY_TOO_SMALL,
                f"{concurrent} sandboxes of {resolved.cpu_millis}m CPU ask for {report.cpus_needed:g} cores; "
                f"the backend has {report.cpus} (more than {CPU_OVERCOMMIT:g}x oversubscribed)",
                "concurrent",
            )
        )
    if resolved.lifetime_seconds and duration > resolved.lifetime_seconds:
        add(
            Problem(
                ProblemKind.LIFETIME_TOO_SHORT,
                f"sandboxes live at most {resolved.lifetime_seconds}s but the run is expected to take "
                f"{duration:g}s",
                "limits.lifetime_seconds",
            )
        )

    tenant = current_tenant()
    quota = control.quotas.of(tenant)
    held = control.usage(tenant)
    if quota.max_sandboxes and held.sandboxes + concurrent > quota.max_sandboxes:
        add(
            Problem(
                ProblemKind.QUOTA_TOO_SMALL,
                f"tenant {tenant!r} may hold {quota.max_sandboxes} sandboxes and holds {held.sandboxes}; "
                f"{concurrent} more do not fit",
                f"tenants.{tenant}.max_sandboxes",
            )
        )
    if quota.max_memory_bytes and held.memory_bytes + report.memory_needed_bytes > quota.max_memory_bytes:
        add(
            Problem(
                ProblemKind.QUOTA_TOO_SMALL,
                f"tenant {tenant!r} may use {quota.max_memory_bytes} bytes of memory; the run needs "
                f"{report.memory_needed_bytes} more",
                f"tenants.{tenant}.max_memory_bytes",
            )
        )
    if quota.creates_per_minute and concurrent > quota.creates_per_minute:
        add(
            Problem(
                ProblemKind.QUOTA_TOO_SMALL,
                f"tenant {tenant!r} may start {quota.creates_per_minute} sandboxes per minute; starting "
                f"{concurrent} at once will be throttled",
                f"tenants.{tenant}.creates_per_minute",
            )
        )

    # The backend's quotas count every sandbox, warm ones included: those
    # already warm are in; the rest must still fit.
    new = max(0, concurrent - ready)
    if report.quota_sandboxes_left is not None and new > report.quota_sandboxes_left:
        add(
            Problem(
                ProblemKind.QUOTA_TOO_SMALL,
                f"the backend's quotas leave room for {report.quota_sandboxes_left} more sandboxes of tenant "
                f"{tenant!r}; the run needs {new} more",
                "backend quota (pods)",
            )
        )
    memory_new = new * resolved.memory_bytes
    if report.quota_memory_left_bytes is not None and memory_new > report.quota_memory_left_bytes:
        add(
            Problem(
                ProblemKind.QUOTA_TOO_SMALL,
                f"the backend's quotas leave {report.quota_memory_left_bytes} bytes of memory limits for "
                f"tenant {tenant!r}; the run needs {memory_new} more",
                "backend quota (limits.memory)",
            )
        )

    start = statistics.median(starts) if starts else 0.0
    report.measured_start_seconds = start
    missing = max(0, concurrent - ready)
    per_wave = max(1, control.reconciler.start_window())
    report.predicted_warm_seconds = math.ceil(missing / per_wave) * (start or DEFAULT_START_SECONDS)
    return report


async def image_problems(control: ControlPlane, images: Sequence[str]) -> list[Problem]:
    """Each image that is neither on the engine nor in a registry it reaches
    (IMAGE_MISSING), or larger than the image cache's budget (IMAGE_TOO_LARGE:
    it could never be kept). Asks the registry without pulling."""
    cache = control.images
    problems: list[Problem] = []
    for image in dict.fromkeys(i for i in images if i):
        if cache is None:
            if not await control.backend.image_exists(image):
                problems.append(
                    Problem(
                        ProblemKind.IMAGE_MISSING,
                        f"image {image!r} is not on the backend; build or load it before the run",
                        "image",
                    )
                )
            continue
        try:
            size, on_engine = await cache.size_of(image)
        except FailedPrecondition as e:
            problems.append(
                Problem(ProblemKind.IMAGE_MISSING, f"{e.message}; push it or fix the name", "image")
            )
            continue
        except Unavailable as e:
            problems.append(
                Problem(
                    ProblemKind.IMAGE_MISSING,
                    f"{e.message}; the run cannot pull it until it answers",
                    "image",
                )
            )
            continue
        if cache.budget and size > cache.budget:
            where = "on the engine" if on_engine else "compressed in its registry, more unpacked"
            problems.append(
                Problem(
                    ProblemKind.IMAGE_TOO_LARGE,
                    f"image {image!r} takes {size} bytes ({where}); the image cache may hold "
                    f"{cache.budget}: raise images.cache_bytes or use a smaller image",
                    "images.cache_bytes",
                )
            )
    return problems
