"""Pools, leases, sandbox lifecycle and the operations the API exposes."""
