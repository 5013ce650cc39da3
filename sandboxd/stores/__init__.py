"""Blob stores for snapshots: a local directory and S3-compatible object
storage, behind one small async port (``BlobStore``)."""

from sandboxd.stores.base import BlobStore
from sandboxd.stores.local import LocalBlobStore
from sandboxd.stores.s3 import S3BlobStore, S3Config

__all__ = ["BlobStore", "LocalBlobStore", "S3BlobStore", "S3Config"]
