"""The Docker backend's model route and egress counts (sandboxd.backends.base.ModelRoutes)."""

from __future__ import annotations

from sandboxd.backends.docker.egress import DockerEgress
from sandboxd.backends.network.gateway import ModelGateway


class DockerModelRoutes:
    """Mixed into DockerBackend, whose ``_egress`` it reads."""

    _egress: DockerEgress

    def use_model_gateway(self, gateway: ModelGateway) -> None:
        """Sandboxes with the model route are served by ``gateway`` from now on."""
        self._egress.model = gateway

    def egress_counts(self) -> dict[str, tuple[int, int]]:
        """(allowed, denied) attempts of each sandbox with egress open, by sandbox id."""
        return {sid: (st.allowed, st.denied) for sid, st in self._egress.all_stats().items()}
