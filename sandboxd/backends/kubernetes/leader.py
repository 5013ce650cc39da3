"""Leader election on a coordination.k8s.io/v1 Lease, so that of several
control-plane replicas exactly one runs the pool reconciler.

The algorithm is client-go's: the holder renews ``spec.renewTime`` every
``retry_period``; a candidate takes the Lease over only when the record has
not changed for ``lease_duration`` *as observed on its own clock* (no
cross-machine clock comparison), and every write carries the resourceVersion
it read, so two candidates cannot both win (the loser gets 409 Conflict). A
leader that cannot renew within ``renew_deadline`` steps down
(``renew_deadline < lease_duration``, so it stops before anyone else may
start). On a clean stop the holder clears the Lease so a standby takes over
at once instead of after ``lease_duration``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sandboxd.backends.kubernetes.client import Json, KubeClient, KubeError

log = logging.getLogger(__name__)


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One replica's side of the election: of every elector on the same Lease, at most one leads."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration")
        self._client = client
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        # Each API call of a round is bounded by it too: a slow API server then
        # fails rounds instead of piling abandoned calls up in the client's
        # threads until no round can run at all.
        self._budget = min(max(1.0, retry_period * 2), renew_deadline / 2)
        self._monotonic = monotonic
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0
        self.leading = asyncio.Event()
        """Set while this elector holds the Lease."""
        self.lost = asyncio.Event()
        """Set when leadership, once held, was lost (not by stop())."""
        self._task: asyncio.Task[None] | None = None

    @property
    def is_leader(self) -> bool:
        """Whether this elector holds the Lease now."""
        return self.leading.is_set()

    def start(self) -> None:
        """Starts campaigning in the background; a second call does nothing."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"leader-election {self.name}")

    async def wait_leading(self, timeout: float | None = None) -> None:
        """Campaigns (if not yet) and returns once leading; TimeoutError after ``timeout`` seconds."""
        self.start()
        await asyncio.wait_for(self.leading.wait(), timeout)

    async def stop(self, release: bool = True) -> None:
        """Stops campaigning; a leader clears the Lease (``release``) so a standby takes over at once."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if release and self.is_leader:
            with contextlib.suppress(KubeError):
                await self._release()
        self.leading.clear()

    async def _run(self) -> None:
        last_renew = self._monotonic()
        while True:
            try:
                ok = await asyncio.wait_for(self.try_acquire_or_renew(), self._budget)
            except (KubeError, TimeoutError) as e:
                log.warning("leader election %s: %s", self.name, e)
                ok = False
            now = self._monotonic()
            if ok:
                last_renew = now
                if not self.is_leader:
                    log.info("leader election %s: %s is now the leader", self.name, self.identity)
                    self.leading.set()
            elif self.is_leader and now - last_renew >= self.renew_deadline:
                log.error("leader election %s: %s could not renew; stepping down", self.name, self.identity)
                self.leading.clear()
                self.lost.set()
            await asyncio.sleep(self.retry_period)

    async def try_acquire_or_renew(self) -> bool:
        """One round: True when this elector holds the Lease afterwards."""
        now = _now_micro()
        try:
            lease = await self._client.request("GET", f"{self._path}/{self.name}", timeout=self._budget)
        except KubeError as e:
            if e.status != 404:
                raise
            body = self._lease_body({}, now, transitions=0, acquire=True)
            try:
                await self._client.request("POST", self._path, body=body, timeout=self._budget)
            except KubeError as e2:
                if e2.status == 409:
                    return False
                raise
            self._observe(self.identity, now)
            return True
        spec: dict[str, Any] = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        renew = str(spec.get("renewTime") or "")
        self._observe(holder, renew)
        mine = holder == self.identity
        expired = self._monotonic() - self._observed_at >= float(spec.get("leaseDurationSeconds") or 0)
        if holder and not mine and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        body = self._lease_body(lease, now, transitions=transitions, acquire=not mine, spec=spec)
        try:
            await self._client.request("PUT", f"{self._path}/{self.name}", body=body, timeout=self._budget)
        except KubeError as e:
            if e.status == 409:  # someone else wrote first
                return False
            raise
        self._observe(self.identity, now)
        return True

    def _observe(self, holder: str, renew: str) -> None:
        if self._observed != (holder, renew):
            self._observed = (holder, renew)
            self._observed_at = self._monotonic()

    def _lease_body(
        self, lease: Json, now: str, *, transitions: int, acquire: bool, spec: dict[str, Any] | None = None
    ) -> Json:
        meta = dict(lease.get("metadata") or {"name": self.name, "namespace": self._namespace})
        new_spec = dict(spec or {})
        new_spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=max(1, round(self.lease_duration)),
            renewTime=now,
            leaseTransitions=transitions,
        )
        if acquire:
            new_spec["acquireTime"] = now
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": new_spec}

    async def _release(self) -> None:
        lease = await self._client.request("GET", f"{self._path}/{self.name}", timeout=self._budget)
        spec = dict(lease.get("spec") or {})
        if spec.get("holderIdentity") != self.identity:
            return
        spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=_now_micro())
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": lease["metadata"],
            "spec": spec,
        }
        await self._client.request("PUT", f"{self._path}/{self.name}", body=body, timeout=self._budget)
