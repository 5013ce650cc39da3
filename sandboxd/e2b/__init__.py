"""An E2B-compatible front end: the unchanged ``e2b`` SDK's control API and
envd (processes, files) served over sandboxd's client."""

from sandboxd.e2b.app import make_app, serve
from sandboxd.e2b.control import E2bSettings

__all__ = ["E2bSettings", "make_app", "serve"]
