"""The control plane: pools, leases, the sandbox lifecycle and the operations the API exposes.

Owns every decision: ``control`` (the composition root) and its three wings,
``registry`` (pools and sandbox records), ``leasing`` (acquire, heartbeat,
release, expiry) and ``operations`` (exec and files); ``pools`` (warm pools),
``reconciler``, ``scaling`` and ``capacity`` (how many, when); ``snapshots``;
``rollouts`` (the rollout queue); ``images`` (the image cache); ``state``
and ``ledger_state`` (the state store); ``quotas`` and ``tenancy``;
``validation`` (input checks that name the field).

May import: the backends' port (``sandboxd.backends.base`` and the helpers
beside it, never a backend's own package: the app hands one in),
``sandboxd.stores`` (the blob store's port), ``sandboxd.settings`` and
the settings modules beside it, ``sandboxd.clock`` and ``sandboxd.errors``.
Never ``sandboxd.api``: the layers contract in pyproject.toml checks it.
"""
