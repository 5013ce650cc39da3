"""The Kubernetes backend: sandboxes as Pods through the API server.

Owns hardened Pod specs, the watch-fed Pod cache, exec and files over the
API server's exec stream, the ledger that keeps pools and leases in the API
server (Pod annotations, a ConfigMap), leader election, tenant
ResourceQuotas, cluster capacity and image prefetch onto nodes.

May import: the port and shared helpers of ``sandboxd.backends``,
``sandboxd.errors`` and the ``kubernetes`` client. Never another backend
(independence contract), nor anything above the backends layer.
"""

from sandboxd.backends.kubernetes.backend import KubernetesBackend
from sandboxd.backends.kubernetes.leader import LeaderElector
from sandboxd.backends.kubernetes.pods import KubernetesOptions
from sandboxd.backends.kubernetes.podspec import PodOptions

__all__ = ["KubernetesBackend", "KubernetesOptions", "LeaderElector", "PodOptions"]
