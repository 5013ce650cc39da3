"""Egress for sandboxes with a network policy, enforced on the host.

A sandbox with a policy keeps the engine's network "none"; sandboxd gives its
network namespace one veth whose other end lies in a namespace of its own
(sandboxd.backends.network.netns) where only the egress proxy
(sandboxd.backends.network.proxy), its DNS responder
(sandboxd.backends.network.dns) and, for a pool with a model endpoint, the
metered model gateway (sandboxd.backends.network.gateway) listen. Nothing
routes or forwards beyond that address, so every other kind of traffic has
nowhere to go.
"""
