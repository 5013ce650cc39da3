"""A host uid (and gid) of its own for each sandbox.

The kernel counts some limits per real uid, host-wide: inotify instances
and watches (fs.inotify.max_user_*), queued signals (RLIMIT_SIGPENDING),
processes (RLIMIT_NPROC), POSIX message queue bytes. Sandboxes that share a
uid without a user namespace share those budgets, so one that takes them all
breaks inotify_init1, timer_create or fork in every other. Each sandbox is
given a uid from a configured range instead, its gid equal to it.

The allocation lives on the backend's objects (a container's label and
user, a Pod's securityContext): a restarted control plane adopts each
sandbox with the uid it has (adopt()), and a uid is free again only once its
sandbox is gone (release()). The map is in memory and answered synchronously:
the host-side writer asks it for every write.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from sandboxd.backends.base import SANDBOX_UID
from sandboxd.errors import TransientBackendError

log = logging.getLogger(__name__)

SYSTEM_UID_MAX = 999
"""The top of the system users' range (login.defs SYS_UID_MAX): an image's
daemons and root live at or below it."""
NOBODY_UID = 65534
"""The overflow uid (nobody, nogroup) of an unmapped id."""
SANDBOX_NAME = "sandbox"
"""The sandbox user's login name (USER, LOGNAME, its /etc/passwd line)."""


@dataclass(frozen=True)
class UidRange:
    """``count`` uids from ``base``; count 0 = every sandbox as ``shared``."""

    base: int
    count: int
    shared: tuple[int, int] = (SANDBOX_UID, SANDBOX_UID)

    def problem(self) -> str:
        """Why this range cannot serve ("" when it can)."""
        if self.count == 0:
            return ""
        if self.count < 0:
            return "the count cannot be negative"
        top = self.base + self.count - 1
        if self.base <= SYSTEM_UID_MAX:
            return f"it starts at {self.base}, among root and the system users (0-{SYSTEM_UID_MAX})"
        if self.base <= SANDBOX_UID <= top:
            return f"it holds {SANDBOX_UID}, the images' own sandbox user"
        if self.base <= NOBODY_UID <= top:
            return f"it holds {NOBODY_UID}, the overflow uid (nobody)"
        if top >= 2**31 - 1:
            return f"it ends at {top}, past the largest uid (2147483646)"
        return ""

    def overlaps(self, uids: set[int]) -> set[int]:
        """Those of ``uids`` that fall in the range."""
        if self.count == 0:
            return set()
        return {u for u in uids if self.base <= u < self.base + self.count}


DEFAULT_UIDS = UidRange(200_000, 65_536)
"""The range a backend uses unless told otherwise: clear of every system and
login user, and more uids than one host or cluster runs sandboxes."""


class SandboxUids:
    """Which sandbox holds which uid of one range, for one backend."""

    def __init__(self, uids: UidRange, instance: str = "") -> None:
        """``instance`` names the control plane: instances sharing a host
        (or a cluster's nodes) start at different places in the range, so
        that creates racing between them rarely pick one uid, and each
        skips the uids the other's sandboxes are listed with (foreign())."""
        self.range = uids
        self._by_sandbox: dict[str, int] = {}
        self._holder: dict[int, str] = {}
        self._foreign: set[int] = set()
        # Next-fit from where the last one was taken: a freed uid is reused
        # last, not first.
        digest = hashlib.sha256(instance.encode()).digest()
        self._cursor = int.from_bytes(digest[:8], "big") % uids.count if instance and uids.count > 0 else 0

    @property
    def shared(self) -> bool:
        """Every sandbox runs as the one shared user (no range)."""
        return self.range.count == 0

    def allocate(self, sandbox_id: str) -> tuple[int, int]:
        """The uid and gid for a new sandbox (the one it holds already, for a
        retried create); TransientBackendError when every uid of the range
        is held by a live sandbox."""
        if self.shared:
            return self.range.shared
        held = self._by_sandbox.get(sandbox_id)
        if held is not None:
            return held, held
        count = self.range.count
        for step in range(count):
            offset = (self._cursor + step) % count
            uid = self.range.base + offset
            if uid not in self._holder and uid not in self._foreign:
                self._cursor = (offset + 1) % count
                self._take(sandbox_id, uid)
                return uid, uid
        raise TransientBackendError(
            f"no free sandbox uid: all {count} uids from {self.range.base} are held by live sandboxes "
            "(raise the backend's uid_count)"
        )

    def adopt(self, sandbox_id: str, uid: int) -> None:
        """Records that ``sandbox_id`` (found on the backend) runs as ``uid``."""
        if self.shared or not sandbox_id or not self.range.overlaps({uid}):
            return
        holder = self._holder.get(uid)
        if holder is not None and holder != sandbox_id:
            # Two live sandboxes with one uid: made by hand, or by another
            # instance sharing the range. Neither is given to a third.
            log.warning("sandboxes %s and %s both run as uid %d", holder, sandbox_id, uid)
            return
        previous = self._by_sandbox.get(sandbox_id)
        if previous is not None and previous != uid:
            self._holder.pop(previous, None)
        self._take(sandbox_id, uid)

    def foreign(self, uids: set[int]) -> None:
        """The uids other control planes' live sandboxes hold (all of them,
        as last listed): none is given out while they do."""
        self._foreign = self.range.overlaps(uids)

    def release(self, sandbox_id: str) -> None:
        """The sandbox is gone: its uid may be given out again."""
        uid = self._by_sandbox.pop(sandbox_id, None)
        if uid is not None and self._holder.get(uid) == sandbox_id:
            del self._holder[uid]

    def held(self, sandbox_id: str) -> int | None:
        """The uid ``sandbox_id`` holds (None: none, or the range is shared)."""
        return self._by_sandbox.get(sandbox_id)

    def in_use(self) -> int:
        """How many uids are held."""
        return len(self._holder)

    def _take(self, sandbox_id: str, uid: int) -> None:
        self._by_sandbox[sandbox_id] = uid
        self._holder[uid] = sandbox_id


def parse_user(text: str) -> tuple[int, int] | None:
    """``uid:gid`` (or ``uid``) as numbers; None when not numeric."""
    uid, _, gid = text.partition(":")
    gid = gid or uid
    if not (uid.isdigit() and gid.isdigit()):
        return None
    return int(uid), int(gid)


def passwd_for(image_passwd: bytes, uid: int, gid: int, home: str) -> bytes:
    """The image's /etc/passwd with the sandbox user as ``uid``: its own
    line (the images' user of SANDBOX_UID, or SANDBOX_NAME) replaced, every
    other kept."""
    kept = [line for line in image_passwd.splitlines() if not _is_sandbox_entry(line, 2)]
    kept.append(f"{SANDBOX_NAME}:x:{uid}:{gid}:{SANDBOX_NAME}:{home}:/bin/bash".encode())
    return b"\n".join(kept) + b"\n"


def group_for(image_group: bytes, gid: int) -> bytes:
    """The image's /etc/group with the sandbox user's group as ``gid``."""
    kept = [line for line in image_group.splitlines() if not _is_sandbox_entry(line, 2)]
    kept.append(f"{SANDBOX_NAME}:x:{gid}:".encode())
    return b"\n".join(kept) + b"\n"


def ids_in(table: bytes) -> set[int]:
    """The numeric ids (third field) of a passwd or group file."""
    out = set()
    for line in table.splitlines():
        fields = line.split(b":")
        if len(fields) > 2 and fields[2].isdigit():
            out.add(int(fields[2]))
    return out


def _is_sandbox_entry(line: bytes, id_field: int) -> bool:
    fields = line.split(b":")
    if not line.strip() or len(fields) <= id_field:
        return not line.strip()
    return fields[0] == SANDBOX_NAME.encode() or fields[id_field] == str(SANDBOX_UID).encode()
