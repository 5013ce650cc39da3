"""A run's figures in dollars at the configured prices (``[cost]``,
sandboxd.cost_settings): what the trainer's waiting costs per step, what
the sandboxes leased for rollouts cost per rollout and per step, and what a
million trained tokens cost. Pure arithmetic over one trailing window."""

from __future__ import annotations

from dataclasses import dataclass

from sandboxd.cost_settings import CostSettings


@dataclass(frozen=True)
class WindowFlow:
    """What happened over one trailing window, as the cost figures need it."""

    trainer_idle_seconds: float
    """Seconds the trainer had its stream open and waited for a batch."""
    trainer_busy_seconds: float
    """Seconds the trainer held a batch."""
    steps: int
    """Batches acknowledged (training steps)."""
    rollouts: int
    """Trajectories whose sandboxes were let go of (submitted or cancelled)."""
    sandbox_usd: float
    """What those rollouts' sandboxes cost: CPU and memory reserved times time held."""
    tokens: int
    """Tokens of the trajectories trained on (0 = the generator reports none)."""


@dataclass(frozen=True)
class CostFigures:
    """A run's dollars over the window; per-step and per-token figures are 0 when nothing was counted."""

    trainer_idle_usd_per_step: float
    trainer_idle_usd_per_hour: float
    """The trainer's GPUs' price times its idle share: what waiting costs per hour of wall time."""
    sandbox_usd_per_rollout: float
    sandbox_usd_per_step: float
    usd_per_mtok: float
    """Trainer (busy and idle) plus sandboxes, per million tokens trained on."""
    sandbox_usd_per_mtok: float
    trainer_idle_usd_per_mtok: float
    window_trainer_idle_usd: float
    window_sandbox_usd: float
    sandbox_usd_total: float
    """Every rollout's sandboxes since the run was configured (or the server started)."""
    steps: int
    rollouts: int
    tokens: int
    prices: CostSettings


def cost_figures(prices: CostSettings, flow: WindowFlow, sandbox_usd_total: float) -> CostFigures:
    """The dollar figures of one window's ``flow`` at ``prices``."""
    per_second = prices.trainer_usd_per_second
    idle_usd = flow.trainer_idle_seconds * per_second
    attended = flow.trainer_idle_seconds + flow.trainer_busy_seconds
    trainer_usd = attended * per_second
    mtok = flow.tokens / 1e6

    def per(amount: float, count: float) -> float:
        return amount / count if count > 0 else 0.0

    return CostFigures(
        trainer_idle_usd_per_step=per(idle_usd, flow.steps),
        trainer_idle_usd_per_hour=per(flow.trainer_idle_seconds, attended) * per_second * 3600.0,
        sandbox_usd_per_rollout=per(flow.sandbox_usd, flow.rollouts),
        sandbox_usd_per_step=per(flow.sandbox_usd, flow.steps),
        usd_per_mtok=per(trainer_usd + flow.sandbox_usd, mtok),
        sandbox_usd_per_mtok=per(flow.sandbox_usd, mtok),
        trainer_idle_usd_per_mtok=per(idle_usd, mtok),
        window_trainer_idle_usd=idle_usd,
        window_sandbox_usd=flow.sandbox_usd,
        sandbox_usd_total=sandbox_usd_total,
        steps=flow.steps,
        rollouts=flow.rollouts,
        tokens=flow.tokens,
        prices=prices,
    )
