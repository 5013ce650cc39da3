"""Thin adapters that let RL frameworks use sandboxd with the interfaces they
already speak: a slime-style async Sandbox, a SandboxFusion-compatible
``/run_code`` HTTP endpoint (verl, PipelineRL), and a verifiers-style runtime."""
