"""A pool's ``live_snapshots`` setting: whether its gVisor sandboxes start
with the keeper and relay that let a live snapshot carry their sessions
(sandboxd.backends.docker.keeper), or without them, their shells straight on
``runsc exec`` (a faster start).

"" in a spec takes the default: LIVE_ON for gVisor where the backend can take
live snapshots, LIVE_OFF otherwise. LIVE_ON where live snapshots cannot be
taken (runc, a backend that cannot checkpoint) is refused, naming why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandboxd.backends.base import GVISOR, LiveCheckpoints
from sandboxd.core.tenancy import split_pool_key
from sandboxd.errors import FailedPrecondition, InvalidArgument

if TYPE_CHECKING:
    from sandboxd.core.pools.config import PoolConfig

__all__ = ["FIELD", "LIVE_OFF", "LIVE_ON", "keeps_sessions", "live_setting", "refuse_keeperless"]

LIVE_ON = "on"
"""Sandboxes start with the keeper: live snapshots of them carry their sessions."""
LIVE_OFF = "off"
"""Sandboxes start without the keeper; a live snapshot of one is refused."""
FIELD = "spec.live_snapshots"
"""The setting's name in errors."""


def live_setting(config: PoolConfig, backend: object) -> str:
    """The setting in effect for a pool about to be created on ``backend``
    (its runtime already resolved): INVALID_ARGUMENT for a value other than
    "", LIVE_ON and LIVE_OFF, FAILED_PRECONDITION for LIVE_ON where no live
    snapshot can be taken."""
    asked = config.live_snapshots
    if asked not in ("", LIVE_ON, LIVE_OFF):
        raise InvalidArgument(
            FIELD, f'must be "{LIVE_ON}", "{LIVE_OFF}" or empty (the default), got {asked!r}'
        )
    if config.runtime != GVISOR:
        refusal = f"runtime {config.runtime!r} takes no live snapshots (only gVisor does)"
    elif not isinstance(backend, LiveCheckpoints):
        refusal = f"the {type(backend).__name__} backend takes no live snapshots"
    else:
        refusal = backend.live_refusal(config.runtime)
    if not refusal:
        return asked or LIVE_ON
    if asked == LIVE_ON:
        raise FailedPrecondition(
            f'{FIELD} "{LIVE_ON}" cannot be had here: {refusal}; leave it empty or "{LIVE_OFF}"'
        )
    return LIVE_OFF


def keeps_sessions(config: PoolConfig) -> bool:
    """Whether the pool's sandboxes start with the keeper (a gVisor pool
    whose setting is not LIVE_OFF)."""
    return config.runtime == GVISOR and config.live_snapshots != LIVE_OFF


def refuse_keeperless(config: PoolConfig, what: str) -> None:
    """FAILED_PRECONDITION naming the setting when ``config``'s sandboxes
    were started without the keeper, so ``what`` (a live snapshot of one, a
    restore into one) cannot be done."""
    if config.runtime == GVISOR and not keeps_sessions(config):
        raise FailedPrecondition(
            f'cannot {what}: pool {split_pool_key(config.name)[1]!r} has {FIELD} "{LIVE_OFF}" (its sandboxes '
            "run without the keeper that lets a live snapshot carry their sessions); create the pool with "
            f'{FIELD} "{LIVE_ON}" for live snapshots, or take a file snapshot'
        )
