"""A lease release that a busy server does not lose.

Whoever lets go of a sandbox (a held lease's exit, the release of what a
cancelled acquire may have been granted, an adapter's close) must not leave
its lease to the TTL: the sandbox would outlive its user, and sandboxd keeps
leased sandboxes across its own restarts for their clients to come back to.
So a release the server could not answer (unavailable, busy, past a deadline)
is retried, with a pause that doubles and honours the server's retry hint.
NOT_FOUND means the lease is already gone (expired, reaped, its pool
deleted), which is what a release wants.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sandboxd import errors

__all__ = ["release_lease"]

log = logging.getLogger(__name__)

# Tries of one release, and the pause before the first retry (doubled after each).
_TRIES = 6
_BACKOFF = 0.25
# The longest pause between tries, whatever retry hint the server sent.
_MOST_BACKOFF = 5.0
# Answers that a retry would get again.
_FINAL = (errors.InvalidArgument, errors.PermissionDenied, errors.Unauthenticated)


async def release_lease(release: Callable[[], Awaitable[object]], lease_id: str, owner: str) -> bool:
    """Calls ``release`` (the release of lease ``lease_id``, held by ``owner``) until the
    server has answered it; False, logged, when it refused or never answered."""
    pause = _BACKOFF
    for attempt in range(1, _TRIES + 1):
        try:
            await release()
        except errors.NotFound:
            return True
        except _FINAL as e:
            log.warning("%s: lease %s cannot be released: %s", owner, lease_id, e.message)
            return False
        except errors.SandboxdError as e:
            if attempt == _TRIES:
                log.warning(
                    "%s: lease %s not released after %d tries (%s); it ends with its TTL",
                    owner,
                    lease_id,
                    _TRIES,
                    e.message,
                )
                return False
            hint = getattr(e, "retry_after", None) or 0.0
            await asyncio.sleep(min(_MOST_BACKOFF, max(pause, hint)))
            pause *= 2
        else:
            return True
    return False
