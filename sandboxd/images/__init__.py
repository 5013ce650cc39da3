"""Container images for rollout sandboxes.

The default image is built locally by :mod:`sandboxd.images.build` because no
container registry is reachable from rollout hosts. Import from that module
directly; it is not re-exported here so that ``python -m sandboxd.images.build``
does not import the module twice.
"""
