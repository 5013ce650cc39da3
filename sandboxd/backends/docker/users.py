"""Who a Docker sandbox's user is on the host: its uid and gid, by container.

Each container runs as a uid of its own (sandboxd.backends.uids), named in
its LABEL_USER label and its Config.User, so a restarted control plane
adopts it with that uid and never gives the uid to another sandbox while
the container lives. The image's /etc/passwd and /etc/group, with the
sandbox user's line made to name its uid, are written into the sandbox's
inbox on the host and bind-mounted read-only over the image's: ``id -un``,
``whoami``, getpass, git and ssh find the user on a read-only root.
"""

from __future__ import annotations

import io
import itertools
import tarfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import docker.errors

from sandboxd.backends.base import LABEL_SANDBOX, SANDBOX_UID, WORKSPACE
from sandboxd.backends.uids import SandboxUids, UidRange, group_for, ids_in, parse_user, passwd_for
from sandboxd.errors import PermanentBackendError

LABEL_USER = "sandboxd.user"
"""The sandbox user's host ``uid:gid``, for a restarted control plane."""
PASSWD_FILE = ".sandboxd-passwd"
GROUP_FILE = ".sandboxd-group"
"""The sandbox's /etc/passwd and /etc/group, in its inbox on the host."""
USER_TABLES = (("/etc/passwd", PASSWD_FILE), ("/etc/group", GROUP_FILE))
"""Where each table is mounted, and its file in the inbox."""
# Removals remembered for listings in flight (far more than one listing spans).
_GONE_KEPT = 4096
# What an image without /etc/passwd or /etc/group is taken to have.
_BARE_PASSWD = b"root:x:0:0:root:/root:/bin/sh\n"
_BARE_GROUP = b"root:x:0:\n"


class ContainerUsers:
    """The sandbox user of each container of one backend: allocation from
    the uid range, adoption from labels, and the user tables it sees."""

    def __init__(self, uids: UidRange, shared_user: str, instance: str = "") -> None:
        """``shared_user`` (``uid:gid``) is every sandbox's user when
        ``uids`` is shared, and that of containers made before labels;
        ``instance`` (this control plane's) picks where in the range it
        starts."""
        self.uids = SandboxUids(uids, instance)
        self._shared = parse_user(shared_user) or (0, 0)
        self._users: dict[str, tuple[int, int]] = {}
        # Each handle's sandbox id, so that a remove frees its uid.
        self._sandbox_of: dict[str, str] = {}
        # An image's /etc/passwd and /etc/group, by image id.
        self._tables: dict[str, tuple[bytes, bytes]] = {}
        # Sandboxes removed lately, each with when (a count of removals): a
        # listing that began before a removal must not book its uid again.
        self._clock = itertools.count(1)
        self._now = 0
        self._gone: OrderedDict[str, int] = OrderedDict()

    def allocate(self, sandbox_id: str) -> tuple[int, int] | None:
        """The user of a new sandbox; None when every sandbox shares one."""
        return None if self.uids.shared else self.uids.allocate(sandbox_id)

    def created(self, handle: str, sandbox_id: str, user: tuple[int, int] | None) -> None:
        self._users[handle] = user or self._shared
        self._sandbox_of[handle] = sandbox_id

    def known(self, handle: str) -> tuple[int, int] | None:
        return self._users.get(handle)

    def mark(self) -> int:
        """Now, for adopt(): taken before the engine is asked for a listing."""
        return self._now

    def adopt(
        self, handle: str, labels: dict[str, str], engine_user: str = "", listed_at: int | None = None
    ) -> tuple[int, int]:
        """Records the user a listed container runs as: its label, else its
        Config.User, else (made before either said) the shared user. A
        container removed since ``listed_at`` (mark()) is gone: nothing is
        booked for it."""
        user = parse_user(labels.get(LABEL_USER, "")) or parse_user(engine_user) or self._shared
        sandbox_id = labels.get(LABEL_SANDBOX, "")
        if listed_at is not None and self._gone.get(sandbox_id, -1) > listed_at:
            return user
        self._users[handle] = user
        if sandbox_id:
            self._sandbox_of[handle] = sandbox_id
            self.uids.adopt(sandbox_id, user[0])
        return user

    def foreign(self, labels: list[dict[str, str]]) -> None:
        """The labels of other instances' containers on the same engine:
        their uids are theirs (a host's kernel counts per uid, whoever made
        the sandbox)."""
        users = (parse_user(one.get(LABEL_USER, "")) for one in labels)
        self.uids.foreign({user[0] for user in users if user is not None})

    def removed(self, handle: str) -> None:
        """The container is gone: its uid is free."""
        self._users.pop(handle, None)
        sandbox_id = self._sandbox_of.pop(handle, "")
        if sandbox_id:
            self._forget(sandbox_id)

    def discarded(self, sandbox_id: str) -> None:
        """A create that failed left nothing running: its uid is free."""
        self._forget(sandbox_id)

    def _forget(self, sandbox_id: str) -> None:
        self.uids.release(sandbox_id)
        self._now = next(self._clock)
        self._gone[sandbox_id] = self._now
        self._gone.move_to_end(sandbox_id)
        while len(self._gone) > _GONE_KEPT:
            self._gone.popitem(last=False)

    # -- On a worker thread -------------------------------------------------

    def prepare(self, inbox: Path) -> None:
        """Mount sources must exist at create; they are filled before start."""
        for _, name in USER_TABLES:
            (inbox / name).touch(mode=0o644)

    def fill(
        self, client: Any, container: Any, image: str, inbox: Path | None, user: tuple[int, int]
    ) -> None:
        """Checks the image against the range and writes the sandbox's user
        tables (into ``inbox``) for a created, not yet started container."""
        passwd, group = self._image_tables(client, str(container.attrs.get("Image") or image))
        clash = self.uids.range.overlaps((ids_in(passwd) | ids_in(group)) - {SANDBOX_UID})
        if clash:
            first, last = self.uids.range.base, self.uids.range.base + self.uids.range.count - 1
            raise PermanentBackendError(
                f"image {image!r} has users or groups with ids {sorted(clash)[:5]} inside the sandbox "
                f"uid range {first}-{last}: a sandbox given one would own their files; move the range "
                "(backend.uid_base)"
            )
        if inbox is None:
            return
        try:
            # In place: the mounts name these files.
            (inbox / PASSWD_FILE).write_bytes(passwd_for(passwd, user[0], user[1], WORKSPACE))
            (inbox / GROUP_FILE).write_bytes(group_for(group, user[1]))
        except OSError as e:
            raise PermanentBackendError(f"cannot write the sandbox's user tables in {inbox}: {e}") from e

    def _image_tables(self, client: Any, image_id: str) -> tuple[bytes, bytes]:
        """The /etc/passwd and /etc/group of an image, read once per image
        from a container of its own that never starts: the sandbox's
        container would answer with what is mounted over them."""
        if image_id not in self._tables:
            reader = client.containers.create(image_id, command=["true"], network_disabled=True)
            try:
                passwd = _read_file(reader, "/etc/passwd", _BARE_PASSWD)
                group = _read_file(reader, "/etc/group", _BARE_GROUP)
            finally:
                reader.remove(force=True)
            self._tables[image_id] = passwd, group
        return self._tables[image_id]


def _read_file(container: Any, path: str, missing: bytes) -> bytes:
    try:
        chunks, _ = container.get_archive(path)
    except docker.errors.NotFound:
        return missing
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        member = next((m for m in tar.getmembers() if m.isfile()), None)
        source = tar.extractfile(member) if member is not None else None
        return source.read() if source is not None else missing
