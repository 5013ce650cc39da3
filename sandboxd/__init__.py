"""sandboxd: sandbox orchestration for reinforcement-learning rollouts.

A gRPC control plane (``sandboxd serve``) keeps warm pools of hardened
containers, leases them to rollouts, and runs commands and file transfers in
them. Use ``sandboxd.client.AsyncClient`` or ``sandboxd.client.Client``.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
