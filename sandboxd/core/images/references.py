"""Image references as the engine reads them (sandboxd.backends.image_refs,
where the backends read them too), under the core's name for them."""

from sandboxd.backends.image_refs import DOCKER_HUB, auth_keys, is_digest, normalize, registry_of

__all__ = ["DOCKER_HUB", "auth_keys", "is_digest", "normalize", "registry_of"]
