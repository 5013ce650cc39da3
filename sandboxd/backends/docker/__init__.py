"""The Docker engine backend: sandboxes as hardened containers on a local or remote engine.

Owns containers (create, destroy, list, limits), the engine exec transport
and the session shells on FIFOs or ``runsc exec``, file transfer, cgroup
counters for typed outcomes, gVisor's and crun's specifics, live
checkpoints, images (pulls, builds, disk use) and egress set-up for pools
with a network policy.

May import: the port and shared helpers of ``sandboxd.backends``
(``base``, ``session``, ``hostfs``, ``network``, ...), ``sandboxd.errors``
and the ``docker`` SDK. Never ``sandboxd.backends.kubernetes`` or
``sandboxd.backends.fake`` (independence contract), nor anything above the
backends layer.
"""

from sandboxd.backends.docker.containerspec import DockerOptions

# The backend with gVisor sandboxes' limits read from inside them (gvisor.py).
from sandboxd.backends.docker.gvisor import GvisorAwareBackend as DockerBackend

__all__ = ["DockerBackend", "DockerOptions"]
