"""The ``[model_gateway]`` settings section: how sandboxd's gateway reaches pools' model endpoints."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sandboxd.errors import InvalidArgument


@dataclass(frozen=True)
class ModelGatewaySettings:
    """What the model gateway (sandboxd.backends.network.gateway) sends on and allows.

    [model_gateway]
    api_key = "the vLLM server's --api-key"
    max_calls_per_sandbox = 64
    timeout_seconds = 600
    """

    api_key: str = ""
    """Sent to model endpoints as the bearer token ("" = none); sandboxes never see it."""
    max_calls_per_sandbox: int = 64
    """Calls one sandbox may have open at once; more are answered 429."""
    timeout_seconds: float = 600.0
    """Longest a call may take, its streamed answer included."""

    def check(self) -> ModelGatewaySettings:
        """Itself; INVALID_ARGUMENT naming a bad field."""
        if self.max_calls_per_sandbox < 1:
            raise InvalidArgument("model_gateway.max_calls_per_sandbox", "must be >= 1")
        if not (math.isfinite(self.timeout_seconds) and self.timeout_seconds > 0):
            raise InvalidArgument("model_gateway.timeout_seconds", "must be a positive number of seconds")
        return self
