"""Where things are inside every sandbox, whatever the backend: a leaf
module, so both the backend port and the host-side readers can name them."""

from __future__ import annotations

WORKSPACE = "/workspace"
"""The sandbox's working directory and HOME; the part a snapshot captures."""
