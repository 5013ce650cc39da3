"""Environment snapshots: capture, restore, fork, lineage, retention and GC.

A snapshot holds a workspace (files, modes, symlinks), a session's cwd and
environment, and metadata (policy version, turn, parent). Contents are
content-addressed blobs under a per-tenant namespace, written in packs; the
catalog keeps manifests (deltas on a parent where it can) and lineage.

The package, from the public face down:

- ``manager``: SnapshotManager, the one object the rest of sandboxd uses;
- ``capture`` and ``contents``: taking a snapshot, incremental on the
  sandbox's baseline (``baselines``, ``listing``) and its change journal
  (``journal``); ``reading`` and ``workspaces``: getting at the files;
- ``live``: checkpoints of running sandboxes; ``taking``: what it and
  ``capture`` check, describe and drop alike;
- ``restore`` and ``tars``: verified archives into n fresh sandboxes;
- ``catalog``, ``info``, ``manifest``, ``packs``, ``tarstream``: what is
  stored and how;
- ``gc`` (pins and mark-and-sweep), ``lineage`` (parents and labels).

The blob store is handed in (sandboxd.stores.base.BlobStore); which one a
server uses is the app's choice.

May import: the backends' port (``sandboxd.backends.base``), the blob
store's port (``sandboxd.stores``), the core's records and pools,
``sandboxd.settings``, ``sandboxd.clock`` and ``sandboxd.errors``; never
``sandboxd.api`` or a backend's own package.
"""

from sandboxd.core.snapshots.catalog import SnapshotCatalog
from sandboxd.core.snapshots.gc import GcResult
from sandboxd.core.snapshots.info import ChainRef, SnapshotInfo
from sandboxd.core.snapshots.lineage import LABEL_POLICY, LABEL_SNAPSHOT, LABEL_TURN, lineage_labels
from sandboxd.core.snapshots.manager import SnapshotManager
from sandboxd.core.snapshots.manifest import UnsafeSnapshot
from sandboxd.core.snapshots.packs import blob_key, tenant_namespace

__all__ = [
    "LABEL_POLICY",
    "LABEL_SNAPSHOT",
    "LABEL_TURN",
    "ChainRef",
    "GcResult",
    "SnapshotCatalog",
    "SnapshotInfo",
    "SnapshotManager",
    "UnsafeSnapshot",
    "blob_key",
    "lineage_labels",
    "tenant_namespace",
]
