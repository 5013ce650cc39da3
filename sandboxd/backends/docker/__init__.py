"""Docker engine backend."""

from sandboxd.backends.docker.backend import DockerBackend, DockerOptions

__all__ = ["DockerBackend", "DockerOptions"]
