"""The HTTP errors the Prime routes answer with, raised by handlers and
turned into responses by the app's middleware."""

from __future__ import annotations

__all__ = ["Gone", "Refused"]


class Refused(Exception):
    """A request this server answers with an HTTP error ({"detail": ...})."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class Gone(Exception):
    """The sandbox ended: the gateway answers 410 sandbox_terminated."""
