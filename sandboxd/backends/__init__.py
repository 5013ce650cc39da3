"""Where sandboxes run, behind one small port: ``sandboxd.backends.base``.

Owns the port (``base``: ``Deployment``, ``Runtime`` and the optional ports,
with their plain data types), the adapters behind it (``docker``,
``kubernetes``, ``fake``), and what they share: the shell session and
one-shot runner over an exec transport (``session``, ``shell``), in-place
host reads and writes (``hostfs``, ``hostread``, ``hostwrite``), uid
ranges, image references and the registry API.

May import: ``sandboxd.errors`` (every backend raises only its types) and
modules of this package. Never ``sandboxd.core``, ``sandboxd.api`` or
``sandboxd.stores`` (the layers contract), and no backend imports another
(the independence contract in pyproject.toml).
"""
