"""What E2B's API has that sandboxd does not serve, answered as E2B's error
JSON naming it (the SDK raises it as its ``SandboxException`` and kin with
the message), instead of a bare 404 or 405 that the SDK may take for a
missing sandbox."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from sandboxd.e2b.control import Refused

__all__ = ["UNSERVED", "add_routes"]

NOT_SERVED = 501

UNSERVED: list[tuple[str, str, str]] = [
    (
        "GET",
        "/sandboxes/{sandbox_id}/logs",
        "sandbox logs are not served: read a command's output from its result or its on_stdout/on_stderr",
    ),
    (
        "GET",
        "/v2/sandboxes/{sandbox_id}/logs",
        "sandbox logs are not served: read a command's output from its result or its on_stdout/on_stderr",
    ),
    *(
        (method, path, "secrets are not served: pass values to a sandbox as envs")
        for method, path in [
            ("GET", "/secrets"),
            ("POST", "/secrets"),
            ("GET", "/secrets/{secret_id}"),
            ("POST", "/secrets/{secret_id}"),
            ("DELETE", "/secrets/{secret_id}"),
        ]
    ),
    *(
        (method, path, "volumes are not served: copy files in and out with sandbox.files")
        for method, path in [
            ("GET", "/volumes"),
            ("POST", "/volumes"),
            ("GET", "/volumes/{volume_id}"),
            ("DELETE", "/volumes/{volume_id}"),
        ]
    ),
    *(
        (
            "GET",
            path,
            "listing templates is not served: a template is a sandboxd pool (sandboxd pools lists them), "
            "one the server's templates file maps, or one built through the template builder; "
            "Template.alias_exists answers for one name",
        )
        for path in ("/templates", "/v2/templates", "/default-templates")
    ),
    (
        "GET",
        "/templates/{template_id}",
        "template details are not served: Template.alias_exists answers whether one exists",
    ),
    *(
        (
            "PATCH",
            path,
            "changing a template (public or private) is not served: templates are private to the API key",
        )
        for path in ("/templates/{template_id}", "/v2/templates/{template_id}")
    ),
    (
        "GET",
        "/templates/{template_id}/builds/{build_id}/logs",
        "build logs are served with the build's status (GET .../builds/{build_id}/status?logsOffset=N)",
    ),
    *(
        ("GET", path, "this tag query is not served: GET /templates/{template_id}/tags lists the tags")
        for path in (
            "/templates/{template_id}/tags/count",
            "/templates/{template_id}/tags/exists",
            "/templates/{template_id}/tags/groups",
            "/templates/{template_id}/tags/{tag}/assignments",
        )
    ),
]
"""method, path and why, for each route of E2B's API (the SDK's and its
CLI's) that is not served."""


def _refusal(why: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def refuse(request: web.Request) -> web.StreamResponse:
        raise Refused(NOT_SERVED, f"{request.method} {request.path}: {why}")

    return refuse


def add_routes(app: web.Application) -> None:
    """Each UNSERVED route, answering 501 with its reason."""
    for method, path, why in UNSERVED:
        app.router.add_route(method, path, _refusal(why))
