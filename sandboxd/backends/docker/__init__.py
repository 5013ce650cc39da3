"""Docker engine backend."""

from sandboxd.backends.docker.containers import DockerOptions

# The backend with gVisor sandboxes' limits read from inside them (gvisor.py).
from sandboxd.backends.docker.gvisor import GvisorAwareBackend as DockerBackend

__all__ = ["DockerBackend", "DockerOptions"]
