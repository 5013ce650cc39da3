"""A pool's ``root`` setting: whether its sandboxes may write their image's
root filesystem.

ROOT_READ_ONLY (the default, "" in a spec) keeps the root read-only: only
the workspace and the scratch mounts are writable. ROOT_WRITABLE lets a
sandbox write anywhere the image's permissions allow (a task image's
/tests, /testbed, its WORKDIR), its root's writes bounded apart from the
workspace's by the pool's disk_bytes and max_files, on a backend that can
bound them (WritableRoots).

What a writable root rules out, and why:

- recycling (INVALID_ARGUMENT): a reset in place would have to undo the
  root's changes under a mounted overlay whose upper layer is in use;
- file snapshots and forks from them (FAILED_PRECONDITION): a file
  snapshot holds the workspace only, so a restore would silently lose the
  root's changes.

Live snapshots (gVisor) are taken as of any sandbox: gVisor keeps its root
overlay's upper layer in its own memory file, which the checkpoint carries,
so a live restore brings the root's changes back (into the restored
sandbox's own bounded root).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandboxd.backends.base import WritableRoots
from sandboxd.core.tenancy import split_pool_key
from sandboxd.errors import FailedPrecondition, InvalidArgument

if TYPE_CHECKING:
    from sandboxd.core.pools.config import PoolConfig

__all__ = [
    "FIELD",
    "ROOT_READ_ONLY",
    "ROOT_WRITABLE",
    "check_root",
    "refuse_root_change",
    "refuse_writable_root",
    "root_setting",
    "writable_root",
]

ROOT_READ_ONLY = "read-only"
"""The image's root is read-only (the default)."""
ROOT_WRITABLE = "writable"
"""The image's root is writable, its writes bounded by the pool's disk and file limits."""
FIELD = "spec.root"
"""The setting's name in errors."""


def writable_root(config: PoolConfig) -> bool:
    """Whether the pool's sandboxes have a writable root."""
    return config.root == ROOT_WRITABLE


def check_root(config: PoolConfig) -> None:
    """Validates the setting and its combinations with the rest of the spec
    (INVALID_ARGUMENT naming the fields)."""
    if config.root not in ("", ROOT_READ_ONLY, ROOT_WRITABLE):
        raise InvalidArgument(
            FIELD,
            f'must be "{ROOT_READ_ONLY}", "{ROOT_WRITABLE}" or empty (read-only), got {config.root[:64]!r}',
        )
    if writable_root(config) and config.recycle not in ("", "off"):
        raise InvalidArgument(
            FIELD,
            f'"{ROOT_WRITABLE}" cannot be combined with spec.recycle "{config.recycle}": a writable '
            "root's changes cannot be undone in place while its overlay is in use; set spec.recycle "
            f'"off" (released sandboxes are destroyed) or spec.root "{ROOT_READ_ONLY}"',
        )


async def root_setting(config: PoolConfig, backend: object) -> str:
    """The setting in effect for a pool about to be created on ``backend``
    (its runtime resolved): FAILED_PRECONDITION, naming why, when the
    backend cannot bound a writable root for that runtime."""
    check_root(config)
    if not writable_root(config):
        return ROOT_READ_ONLY
    if not isinstance(backend, WritableRoots):
        refusal: str | None = f"the {type(backend).__name__} backend cannot bound a writable root"
    else:
        refusal = await backend.root_refusal(config.runtime)
    if refusal:
        raise FailedPrecondition(
            f'{FIELD} "{ROOT_WRITABLE}" cannot be had here: {refusal}; leave it empty (read-only root, '
            "writable workspace, /tmp and /mnt)"
        )
    return ROOT_WRITABLE


def refuse_root_change(source: PoolConfig, target: PoolConfig, what: str) -> None:
    """FAILED_PRECONDITION when a live snapshot taken in ``source``'s pool
    would be restored into ``target``'s with the other root setting: gVisor
    restores a checkpoint only into a sandbox whose mounts are alike."""
    have, want = source.root or ROOT_READ_ONLY, target.root or ROOT_READ_ONLY
    if have != want:
        raise FailedPrecondition(
            f"cannot {what} into pool {split_pool_key(target.name)[1]!r}: it was taken in a sandbox whose "
            f'{FIELD} is "{have}", and this pool\'s is "{want}" (a checkpoint restores only into a sandbox '
            f'with the same root); restore it into a pool with {FIELD} "{have}"'
        )


def refuse_writable_root(config: PoolConfig, what: str) -> None:
    """FAILED_PRECONDITION naming the setting when ``config``'s sandboxes
    have a writable root, whose changes ``what`` (a snapshot) would lose."""
    if writable_root(config):
        raise FailedPrecondition(
            f"cannot {what}: pool {split_pool_key(config.name)[1]!r} has {FIELD} "
            f'"{ROOT_WRITABLE}", and a file snapshot holds the workspace only (the root\'s changes would '
            "be lost on restore); take a live snapshot (gVisor pools with live_snapshots on carry the "
            f'root), snapshot sandboxes of a pool with {FIELD} "{ROOT_READ_ONLY}", or keep this one leased'
        )
