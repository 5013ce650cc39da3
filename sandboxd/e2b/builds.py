"""E2B's template builder (the SDK's ``Template``/``AsyncTemplate``: build,
build_in_background, get_build_status, tags) over sandboxd's image builds.

A build is requested (POST /v3/templates; /v2/templates for older SDKs),
its COPY steps' files uploaded (GET /templates/{id}/files/{hash} answers a
link on this API's own address, the SDK PUTs a tar there), and started
(POST /v2/templates/{id}/builds/{build}): its steps become a Dockerfile
(sandboxd.e2b.steps) that the server's image cache builds, and the image
becomes the template, its sandboxes leased from the pool the server names
for built templates (``--build-pool``: one serving any image). Bad input is
E2B's 400 (the SDK's BuildException); a step that fails while building
makes the build's status ``error`` with the step's name, which the SDK
raises as BuildException pointing at the builder call that made the step."""

from __future__ import annotations

import asyncio
import re
import secrets
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from aiohttp import web

from sandboxd import errors
from sandboxd.e2b.catalog import BUILDING, DEFAULT_TAG, READY, WAITING, Build, Built, NotBuilt, split_ref
from sandboxd.e2b.control import Control, Refused, body, resolve_template
from sandboxd.e2b.steps import BASE, StepError, Translated, failed_step, translate
from sandboxd.e2b.uploads import UPLOAD_PATH

__all__ = ["add_routes"]

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$", re.IGNORECASE)
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_HASH = re.compile(r"^[A-Za-z0-9_-]{8,128}$")
_BRACKETED = re.compile(r"\[(/[^\]]*)\]")
STATUS_PAGE = 100
"""Log entries a status answer holds at most (E2B's)."""


def _built(control: Control, request: web.Request) -> tuple[str, Built]:
    key = control.key(request)
    template_id = request.match_info["template_id"]
    built = control.catalog.find(key, template_id)
    if built is None:
        raise Refused(404, f"template '{template_id}' not found")
    return key, built


def _name_and_tags(given: dict[str, Any]) -> tuple[str, list[str]]:
    raw = given.get("name") or given.get("alias")
    if not isinstance(raw, str) or not raw:
        raise Refused(400, "name is required: the template's name (optionally name:tag)")
    name, tag = split_ref(raw)
    tags = given.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise Refused(400, "tags must be a list of strings")
    tags = [*([tag] if tag else []), *tags] or [DEFAULT_TAG]
    if not _NAME.match(name):
        raise Refused(400, f"template name {name!r} must be letters, digits, '.', '_' or '-'")
    for t in tags:
        if not _TAG.match(t):
            raise Refused(400, f"tag {t!r} must be letters, digits, '.', '_' or '-'")
    return name, tags


async def request_build(control: Control, request: web.Request) -> web.Response:
    key = control.key(request)
    if control.settings.build_image is None or not control.settings.build_pool:
        raise Refused(
            501,
            "template builds are not served here: start the E2B API with --build-pool (a pool "
            "serving any image) on a server that builds images, or define the template in its templates file",
        )
    name, tags = _name_and_tags(await body(request))
    built = control.catalog.template(key, name)
    build = control.catalog.new_build(built)
    # E2B tags a build as it starts: a tag may name a build still running.
    built.tag(tags, build.id)
    await control.catalog.changed()
    answer = {
        "templateID": built.id,
        "buildID": build.id,
        "public": False,
        "names": [name],
        "aliases": [name],
        "tags": tags,
    }
    return web.json_response(answer, status=202)


async def file_link(control: Control, request: web.Request) -> web.Response:
    key, _ = _built(control, request)
    files_hash = request.match_info["hash"]
    if not _HASH.match(files_hash):
        raise Refused(400, f"files hash {files_hash!r} is not a hash")
    if await control.uploads.present(key, files_hash):
        return web.json_response({"present": True}, status=201)
    url = f"{request.url.origin()}{UPLOAD_PATH.format(token=control.uploads.link(key, files_hash))}"
    return web.json_response({"present": False, "url": url}, status=201)


async def upload(control: Control, request: web.Request) -> web.Response:
    expected = control.uploads.take(request.match_info["token"])
    if expected is None:
        raise Refused(404, "no upload is expected at this link: ask for a new one")
    final = await control.uploads.path(*expected)
    partial = final.with_suffix(f".{secrets.token_hex(4)}.part")
    fh = await asyncio.to_thread(partial.open, "wb")
    try:
        async for chunk in request.content.iter_chunked(1 << 20):
            await asyncio.to_thread(fh.write, chunk)
    except BaseException:
        await asyncio.to_thread(fh.close)
        await asyncio.to_thread(partial.unlink, True)
        raise
    await asyncio.to_thread(fh.close)
    await asyncio.to_thread(partial.replace, final)
    return web.Response(status=200)


async def _base_image(control: Control, key: str, given: dict[str, Any]) -> str:
    image, template = given.get("fromImage"), given.get("fromTemplate")
    if image and template:
        raise StepError(BASE, "fromImage and fromTemplate: one or the other")
    if image:
        if not isinstance(image, str):
            raise StepError(BASE, "fromImage must be an image reference")
        return image
    if not isinstance(template, str) or not template:
        raise StepError(BASE, "a base image (from_image) or template (from_template) is required")
    try:
        build = control.catalog.resolve(key, template)
    except NotBuilt as e:
        raise StepError(BASE, f"from_template: {e}") from e
    if build is not None:
        return build.image
    try:
        target = await resolve_template(control, control.client_for(key), template)
    except Refused as e:
        raise StepError(BASE, f"from_template: {e.message}") from e
    if target.image:
        return target.image
    try:
        pool = await control.client_for(key).get_pool(target.pool)
    except errors.SandboxdError as e:
        raise StepError(BASE, f"from_template {template!r}: {e}") from e
    return pool.spec.image


async def start_build(control: Control, request: web.Request) -> web.Response:
    key, built = _built(control, request)
    build = built.builds.get(request.match_info["build_id"])
    if build is None:
        raise Refused(404, f"build '{request.match_info['build_id']}' of template '{built.name}' not found")
    if build.status != WAITING:
        raise Refused(409, f"build '{build.id}' was started already")
    given = await body(request)
    try:
        translated = translate(given, await _base_image(control, key, given))
        for files_hash, step in translated.copies.items():
            if not await control.uploads.present(key, files_hash):
                raise StepError(step, f"the files of hash {files_hash} were not uploaded")
    except StepError as e:
        build.fail(e.message, e.step)
        await control.catalog.changed()
        raise Refused(400, e.message) from e
    build.start_cmd, build.ready_cmd = translated.start_cmd, translated.ready_cmd
    build.user, build.workdir = translated.user, translated.workdir
    build.status = BUILDING
    build.log(f"building template {built.name} ({built.id}) build {build.id}")
    task = _run(control, key, build, translated)
    build.task = asyncio.create_task(task, name=f"e2b build {build.id}")
    return web.Response(status=202)


def _context(root: Path, translated: Translated, archives: dict[str, Path]) -> None:
    (root / "Dockerfile").write_text(translated.dockerfile)
    for files_hash, archive in archives.items():
        dest = root / "files" / files_hash
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive, "r:*") as tar:
            tar.extractall(dest, filter="data")


async def _run(control: Control, key: str, build: Build, translated: Translated) -> None:
    assert control.settings.build_image is not None
    archives = {h: await control.uploads.path(key, h) for h in translated.copies}
    root = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="sandboxd-e2b-build-"))
    try:
        await asyncio.to_thread(_context, root, translated, archives)
        build.image = await control.settings.build_image(root, lambda line: build.log(_plain(line)))
    except errors.BuildFailed as e:
        build.fail(_plain(str(e)), failed_step(translated, e.step))
        await control.catalog.changed()
        return
    except (errors.SandboxdError, tarfile.TarError, OSError) as e:
        build.fail(f"the build could not run: {e}", BASE)
        await control.catalog.changed()
        return
    except Exception as e:
        # Whatever else ends the task must still end the build: the SDK polls
        # its status until it is ready or an error.
        build.fail(f"the build failed unexpectedly: {type(e).__name__}: {e}", BASE)
        await control.catalog.changed()
        raise
    finally:
        await asyncio.to_thread(shutil.rmtree, root, True)
    build.finish_log()
    build.status = READY
    build.log(f"template ready: image {build.image}")
    await control.catalog.changed()


def _plain(message: str) -> str:
    """A build's log line or failure with the engine's bracketed command
    lines (``[/bin/sh -c ...]``) quoted instead: consoles that print E2B's
    build messages as markup (Harbor's, through rich) take ``[/...]`` for a
    closing tag and fail on it."""
    return _BRACKETED.sub(lambda m: f"'{m.group(1)}'", message)


async def build_status(control: Control, request: web.Request) -> web.Response:
    _, built = _built(control, request)
    build = built.builds.get(request.match_info["build_id"])
    if build is None:
        raise Refused(404, f"build '{request.match_info['build_id']}' of template '{built.name}' not found")
    try:
        offset = int(request.query.get("logsOffset", "0"))
        limit = min(int(request.query.get("limit", str(STATUS_PAGE))), STATUS_PAGE)
    except ValueError as e:
        raise Refused(400, "logsOffset and limit must be integers") from e
    if offset < 0 or limit < 0:
        raise Refused(400, "logsOffset and limit must not be negative")
    entries = build.entries[offset : offset + limit]
    answer: dict[str, Any] = {
        "templateID": built.id,
        "buildID": build.id,
        "status": build.status,
        "logEntries": entries,
        "logs": [e["message"] for e in entries],
    }
    if build.reason is not None:
        answer["reason"] = build.reason
    return web.json_response(answer)


async def list_tags(control: Control, request: web.Request) -> web.Response:
    _, built = _built(control, request)
    return web.json_response(built.listed_tags())


async def assign_tags(control: Control, request: web.Request) -> web.Response:
    key = control.key(request)
    given = await body(request)
    target, tags = given.get("target"), given.get("tags")
    if not isinstance(target, str) or not isinstance(tags, list) or not tags:
        raise Refused(400, "target (name:tag or name:build id) and tags are required")
    name, ref = split_ref(target)
    built = control.catalog.find(key, name)
    if built is None:
        raise Refused(404, f"template '{name}' not found")
    ref = ref or DEFAULT_TAG
    build_id = ref if ref in built.builds else built.tags.get(ref, ("", None))[0]
    if not build_id:
        raise Refused(404, f"tag '{ref}' does not exist for template '{name}'")
    for t in tags:
        if not isinstance(t, str) or not _TAG.match(t):
            raise Refused(400, f"tag {t!r} must be letters, digits, '.', '_' or '-'")
    built.tag(tags, build_id)
    await control.catalog.changed()
    return web.json_response({"tags": tags, "buildID": build_id}, status=201)


async def remove_tags(control: Control, request: web.Request) -> web.Response:
    key = control.key(request)
    given = await body(request)
    name, tags = given.get("name"), given.get("tags")
    if not isinstance(name, str) or not isinstance(tags, list):
        raise Refused(400, "name and tags are required")
    built = control.catalog.find(key, name)
    if built is None:
        raise Refused(404, f"template '{name}' not found")
    for t in tags:
        built.tags.pop(t, None)
    await control.catalog.changed()
    return web.Response(status=204)


def add_routes(app: web.Application, route: Any) -> None:
    """The builder's routes; ``route`` binds a handler to the app's Control."""
    r = app.router
    r.add_post("/v3/templates", route(request_build))
    r.add_post("/v2/templates", route(request_build))
    r.add_get("/templates/{template_id}/files/{hash}", route(file_link))
    r.add_put(UPLOAD_PATH, route(upload))
    r.add_post("/v2/templates/{template_id}/builds/{build_id}", route(start_build))
    r.add_get("/templates/{template_id}/builds/{build_id}/status", route(build_status))
    r.add_get("/templates/{template_id}/tags", route(list_tags))
    r.add_post("/templates/tags", route(assign_tags))
    r.add_delete("/templates/tags", route(remove_tags))
