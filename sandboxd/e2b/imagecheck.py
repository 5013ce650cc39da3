"""Whether a built template's image can still start sandboxes.

A template built through E2B's builder has an image only this engine holds
(no registry has it), which the image cache may evict or an operator
remove; a create from it must then say so and how to mend it, not surface
the failed pull as a rate limit or an outage."""

from __future__ import annotations

import logging

from sandboxd import errors
from sandboxd.client import AsyncClient
from sandboxd.v1 import preflight_pb2

__all__ = ["gone_image", "image_missing"]

log = logging.getLogger(__name__)


async def image_missing(client: AsyncClient, image: str) -> str:
    """Why ``image`` cannot start sandboxes ("" = it can, or it could not be checked)."""
    try:
        answer = await client.preflight(concurrent=1, image=image)
    except errors.SandboxdError as e:
        log.warning("the image %s of a built E2B template could not be checked: %s", image, e)
        return ""
    missing = [p.message for p in answer.problems if p.kind == preflight_pb2.PROBLEM_KIND_IMAGE_MISSING]
    return missing[0] if missing else ""


def gone_image(image: str, why: str) -> str:
    """What a create from a template whose image is gone is told."""
    return (
        f"its image {image} is no longer on the engine (removed, or evicted by the image cache) "
        f"and cannot be pulled ({why}): build the template again"
    )
