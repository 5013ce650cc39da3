"""Thin adapters that let RL frameworks use sandboxd with the interfaces they
already speak, names and meanings kept: slime's ``Sandbox`` Protocol
(``slime``), Prime Intellect's sandbox API for the ``prime-sandboxes`` SDK
(``prime``), a mini-swe-agent environment (``miniswe``), rLLM's ``Sandbox``
(``rllm``), a SandboxFusion-compatible ``/run_code`` endpoint
(``sandboxfusion``: verl, PipelineRL) and a verifiers-style runtime
(``verifiers``).

May import: only the public client API — ``sandboxd.client``, the generated
``sandboxd.v1`` and ``sandboxd.errors`` — and each framework's own package;
nothing of the server (pyproject.toml's "Client side speaks only the public
client API" contract checks it)."""
