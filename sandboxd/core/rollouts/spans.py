"""A finished trajectory's lifecycle as OpenTelemetry spans: one trace per
trajectory, rooted at ``sandboxd.rollout``, a child span per stage, and the
sandbox's start under the acquire of a cold one. The spans are written when
the trajectory's life ends, with the moments it went through as their
start and end times."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Tracer
from opentelemetry.util.types import AttributeValue

from sandboxd.core.rollouts.timeline import Milestones, SandboxFacts, stage_spans

ROOT_SPAN = "sandboxd.rollout"
STAGE_SPAN_PREFIX = "sandboxd.rollout."
SANDBOX_START_SPAN = "sandboxd.sandbox.start"


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def emit_trajectory(
    tracer: Tracer,
    m: Milestones,
    attributes: dict[str, AttributeValue],
    sandbox: SandboxFacts | None,
) -> None:
    """Writes one trajectory's trace; nothing when no stage happened."""
    stages = stage_spans(m)
    if not stages:
        return
    start, end = stages[0][1], max(e for _, _, e in stages)
    # A fresh context: the trace is the trajectory's own, not the RPC's that ended it.
    root = tracer.start_span(ROOT_SPAN, context=Context(), start_time=_ns(start), attributes=attributes)
    parent = trace.set_span_in_context(root)
    for name, a, b in stages:
        attrs: dict[str, AttributeValue] = {"sandboxd.stage": name}
        if name == "acquire" and sandbox is not None:
            attrs.update(
                {
                    "sandboxd.sandbox_id": sandbox.sandbox_id,
                    "sandboxd.lease_id": sandbox.lease_id,
                    "sandboxd.warm": sandbox.warm,
                    "sandboxd.image_pulled": sandbox.image_pulled,
                }
            )
        span = tracer.start_span(
            STAGE_SPAN_PREFIX + name, context=parent, start_time=_ns(a), attributes=attrs
        )
        if name == "acquire" and sandbox is not None and not sandbox.warm and sandbox.ready_at >= a:
            started = max(a, sandbox.created_at)
            child = tracer.start_span(
                SANDBOX_START_SPAN,
                context=trace.set_span_in_context(span),
                start_time=_ns(started),
                attributes={
                    "sandboxd.sandbox_id": sandbox.sandbox_id,
                    "sandboxd.image_pulled": sandbox.image_pulled,
                },
            )
            child.end(end_time=_ns(sandbox.ready_at))
        span.end(end_time=_ns(b))
    root.end(end_time=_ns(end))
