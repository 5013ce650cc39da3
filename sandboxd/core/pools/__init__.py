"""Warm pools: each keeps READY sandboxes for its acquirers, hands them out
in FIFO order, and creates more while acquirers wait.

How many it keeps READY is the scaling policy's call (sandboxd.core.scaling):
``min_ready`` is the floor, and a pool whose ``max_ready`` is above it follows
demand between the two (acquire rate, start-up latency, announced demand).
The pool gathers the signals and carries out create and destroy decisions; its
host (the reconciler, sandboxd.core.reconciler) decides when, across all
pools, within a global budget. The pool knows its host only as the small
``PoolHost`` protocol, and the host is always handed in.

Creates in flight are counted (``creating``) so the pool never over-creates
from a stale view, at most ``max_starting`` run at once, each backend attempt
is paced, transient failures are retried in place (tenacity, exponential
backoff with jitter) while the pool holds back new creates, and a permanent
failure (missing image, rejected spec) fails the pool's acquirers at once.

A recycling pool (``spec.recycle``) resets a released sandbox in place and
hands it out again instead of destroying it, once its checks find nothing in
doubt (``recycle``).

The pieces: ``config`` (the spec and its checks), ``warm`` (WarmPool),
``figures`` (its counts, signals and gauges), ``releasing`` (where released
and lost sandboxes go), ``recycle`` (which are reset, the reset and its
figures), ``host`` (PoolHost), ``handout`` (READY sandboxes and the
acquirers in line), ``starting`` (backend creates and their retries),
``demand`` (signals and the policy's memory). Other modules import from here.

May import: the backends' port (``sandboxd.backends.base``), the image cache
(``sandboxd.core.images``), ``sandboxd.clock``, ``sandboxd.errors`` and the
core's own helpers (lifecycle, scaling, meters, validation); never ``sandboxd.api``,
a backend's own package, or the wings above it (registry, leasing).
"""

from sandboxd.core.pools.config import PoolConfig, check_scaling
from sandboxd.core.pools.host import PoolHost
from sandboxd.core.pools.starting import new_sandbox_id
from sandboxd.core.pools.warm import WarmPool

__all__ = ["PoolConfig", "PoolHost", "WarmPool", "check_scaling", "new_sandbox_id"]
