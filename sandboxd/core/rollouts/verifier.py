"""A trajectory's verifier: the reward command run in its sandbox at submit,
and how its output becomes a reward (or a typed failure)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from sandboxd.backends.base import ExecOutcome, ExecResult, OutputChunk
from sandboxd.core.control import ControlPlane, ExecRequest
from sandboxd.core.rollouts.model import InfraFailure, StepReward, Trajectory
from sandboxd.errors import BackendError, InvalidArgument, NotFound, SandboxdError


@dataclass(frozen=True)
class VerifierSpec:
    """A reward command to run in ``sandbox_id`` ("" = the trajectory's own sandbox) at submit."""

    sandbox_id: str
    command: str
    timeout: float = 0.0


def parse_reward(stdout: bytes) -> tuple[float, dict[str, float], list[StepReward]] | None:
    """A verifier's reward: JSON {"reward", "components", "steps"} on the
    last non-empty line, or a bare number there; None when neither."""
    lines = [ln.strip() for ln in stdout.decode(errors="replace").splitlines() if ln.strip()]
    if not lines:
        return None
    last = lines[-1]
    try:
        value = json.loads(last)
    except ValueError:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (float(value), {}, []) if math.isfinite(value) else None
    if not isinstance(value, dict) or not isinstance(value.get("reward"), int | float):
        return None
    try:
        components = {str(k): float(v) for k, v in dict(value.get("components", {})).items()}
        steps = [
            StepReward(int(s.get("step", i)), float(s["reward"]), {str(k): float(v) for k, v in
                       dict(s.get("components", {})).items()})
            for i, s in enumerate(value.get("steps", []))
        ]  # fmt: skip
    except (TypeError, ValueError, KeyError, AttributeError):
        return None
    return float(value["reward"]), components, steps


async def run_verifier(control: ControlPlane | None, t: Trajectory, spec: VerifierSpec) -> None:
    """Runs the verifier; fills reward and components, or types the failure."""
    if t.failure is not InfraFailure.NONE:
        return
    if control is None:
        t.failure, t.failure_detail = InfraFailure.BACKEND, "no control plane to run verifiers"
        return
    try:
        rec, exec_spec = control.prepare_exec(
            ExecRequest(sandbox_id=spec.sandbox_id or t.sandbox_id, shell=spec.command, timeout=spec.timeout)
        )
        out: list[bytes] = []
        result: ExecResult | None = None
        async for event in control.exec(rec, exec_spec):
            if isinstance(event, OutputChunk):
                if event.stream == 1:
                    out.append(event.data)
            else:
                result = event
    except (NotFound, BackendError) as e:
        t.failure = InfraFailure.SANDBOX_LOST if isinstance(e, NotFound) else InfraFailure.BACKEND
        t.failure_detail = str(e)
        return
    except InvalidArgument:
        raise
    except SandboxdError as e:
        t.failure, t.failure_detail = InfraFailure.BACKEND, str(e)
        return
    if result is None or result.outcome is ExecOutcome.SANDBOX_LOST:
        t.failure = InfraFailure.SANDBOX_LOST
        t.failure_detail = result.detail if result else "no result"
        return
    parsed = parse_reward(b"".join(out))
    if parsed is None:
        t.failure = InfraFailure.VERIFIER
        how = f"{result.outcome.name.lower()} (exit {result.exit_code})"
        t.failure_detail = f"verifier {how} without a reward"
        return
    t.reward, components, steps = parsed
    t.components.update(components)
    t.steps = steps or t.steps
