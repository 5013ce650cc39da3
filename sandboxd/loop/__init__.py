"""The reference generator and GRPO trainer on the rollout queue.

Owns ``run_loop`` (a small policy writing arithmetic programs, its rewards
computed by a verifier in sandboxes) and the OpenAI-compatible generator
for real models.

May import: only the public client API — ``sandboxd.client``, the generated
``sandboxd.v1`` and ``sandboxd.errors``; an embedded server for ``sandboxd
loop`` is started by ``sandboxd.cli``, never from here. pyproject.toml's
"Client side speaks only the public client API" contract checks it.
"""

from sandboxd.loop.run import LoopConfig, LoopResult, run_loop

__all__ = ["LoopConfig", "LoopResult", "run_loop"]
