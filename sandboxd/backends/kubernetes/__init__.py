"""The Kubernetes backend: sandboxes as Pods through the API server."""

from sandboxd.backends.kubernetes.backend import KubernetesBackend
from sandboxd.backends.kubernetes.leader import LeaderElector
from sandboxd.backends.kubernetes.pods import KubernetesOptions
from sandboxd.backends.kubernetes.podspec import PodOptions

__all__ = ["KubernetesBackend", "KubernetesOptions", "LeaderElector", "PodOptions"]
