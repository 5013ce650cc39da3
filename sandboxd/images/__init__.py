"""Container images for rollout sandboxes: the recipes sandboxd builds itself.

Owns the default image (``build``: debootstrap ``--variant=minbase`` and
``docker import``, cached by a hash of its recipe) and the code-judge image
for ``sandboxd run-code`` (``codejudge``), both bootstrapped from the
mirror ``mirror`` finds in the host's apt sources, with the steps that
do not depend on a recipe in ``steps``; and BuildKit's Dockerfile frontend
(``dockerfile_frontend``: syntax 1.4, compiled from its Go module) for
builds whose Dockerfiles use heredocs. The default image is built
locally because no container registry is reachable from rollout hosts.
Import from those modules directly; nothing is re-exported here, so that
``python -m sandboxd.images.build`` does not import the module twice.

May import: the standard library (it runs debootstrap and the docker CLI)
and the SandboxFusion adapter's language table for the code-judge image. The
image cache that pulls and evicts images at run time is
``sandboxd.core.images``, not this package.
"""
