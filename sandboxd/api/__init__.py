"""gRPC servicers and interceptors: decode a request, call the core, encode the answer.

Owns: one servicer per service of ``proto/sandboxd/v1`` (pools, sandboxes,
exec, files, snapshots, demand, preflight, rollouts), the conversions
between protobuf messages and core types (``convert``), authentication and
tenancy (``auth``), tracing, and the one table from sandboxd's error tree to
gRPC status codes (``errors``), applied by an interceptor to every RPC.

May import: ``sandboxd.core`` (the control plane's face), the data types of
``sandboxd.backends.base``, ``sandboxd.errors`` and the generated
``sandboxd.v1``. Nothing imports it but ``sandboxd.app`` (the top layer of
the "api -> core -> backends/stores" contract in pyproject.toml).
"""
