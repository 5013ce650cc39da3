"""Reference generator and trainer on the rollout queue (issue 7)."""

from sandboxd.loop.run import LoopConfig, LoopResult, run_loop

__all__ = ["LoopConfig", "LoopResult", "run_loop"]
