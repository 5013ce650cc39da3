"""Blob stores for snapshots: a local directory and S3-compatible object
storage, behind one small async port (``BlobStore``).

Owns the port (``base``) and its two stores (``local``; ``s3``: SigV4 over
aiohttp, multipart uploads). They store bytes by key and know nothing of
snapshots.

May import: ``sandboxd.errors`` and aiohttp. Never ``sandboxd.core`` or
``sandboxd.api`` (layers contract in pyproject.toml).
"""

from sandboxd.stores.base import BlobStore
from sandboxd.stores.local import LocalBlobStore
from sandboxd.stores.s3 import S3BlobStore, S3Config

__all__ = ["BlobStore", "LocalBlobStore", "S3BlobStore", "S3Config"]
