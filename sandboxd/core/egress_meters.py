"""Egress and the model route as OpenTelemetry instruments, observed at each collection.

``sandboxd_egress_denied_total{sandbox,pool}`` and
``sandboxd_egress_allowed_total{sandbox,pool}``: attempts each sandbox with
egress made, denied (a 403 or 429 from its proxy, a name its resolver did not
answer, a cut TLS handshake) and let through; only sandboxes with egress open
are observed, so the label values are bounded by the live sandboxes.
``sandboxd_model_calls_total`` and ``sandboxd_model_tokens_total{kind}``
(prompt, completion): what the model gateway forwarded.
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from sandboxd.backends.base import ModelRoutes
from sandboxd.core.model_route import ModelLedger
from sandboxd.core.registry import SandboxRegistry


def register_egress_meters(
    meter: Meter, backend: ModelRoutes, registry: SandboxRegistry, ledger: ModelLedger
) -> None:
    """Registers the egress counters (read from ``backend``) and the model route's (from ``ledger``)."""

    def counts(which: int) -> list[Observation]:
        records = registry.records
        out = []
        for sandbox_id, pair in sorted(backend.egress_counts().items()):
            rec = records.get(sandbox_id)
            out.append(Observation(pair[which], {"sandbox": sandbox_id, "pool": rec.pool if rec else ""}))
        return out

    def tokens(options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(ledger.prompt_tokens, {"kind": "prompt"}),
            Observation(ledger.completion_tokens, {"kind": "completion"}),
        ]

    meter.create_observable_counter(
        "sandboxd_egress_denied_total",
        callbacks=[lambda options: counts(1)],
        description="Denied egress attempts of each sandbox with egress open (proxy, resolver, TLS name).",
    )
    meter.create_observable_counter(
        "sandboxd_egress_allowed_total",
        callbacks=[lambda options: counts(0)],
        description="Egress connections let through, per sandbox with egress open.",
    )
    meter.create_observable_counter(
        "sandboxd_model_calls_total",
        callbacks=[lambda options: [Observation(ledger.recorded)]],
        description="Calls the model gateway forwarded to pools' model endpoints.",
    )
    meter.create_observable_counter(
        "sandboxd_model_tokens_total",
        callbacks=[tokens],
        description="Tokens of the calls the model gateway forwarded, by kind (prompt, completion).",
    )
