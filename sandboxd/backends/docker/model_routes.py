"""The Docker backend's model route and egress counts (sandboxd.backends.base.ModelRoutes)."""

from __future__ import annotations

from sandboxd.backends.docker.egress import DockerEgress
from sandboxd.backends.network.egress import MODEL_URL
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

    def model_route_refusal(self, runtime: str) -> str | None:
        """The gateway listens in the sandbox's egress namespace: as for a network policy."""
        return self._egress.refusal(runtime)

    def model_url(self) -> str:
        """The fixed in-sandbox address of every sandbox's own listener."""
        return MODEL_URL
