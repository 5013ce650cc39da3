"""The backend's one way to the API server.

Configuration (kubeconfig or in-cluster ServiceAccount), TLS and credentials
come from the official ``kubernetes`` client. Request/response calls go
through its ApiClient on a bounded thread pool (never on the event loop),
with plain JSON dicts in and out: no model objects, so 10,000 Pods stay
cheap. The two streaming calls, watch and exec, use aiohttp with the same
TLS material and token, so a stream costs no thread and can be cancelled.
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import urlencode

import aiohttp
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from sandboxd.errors import BackendError, PermanentBackendError, TransientBackendError

Json = dict[str, Any]
T = TypeVar("T")
_URGENT_THREADS = 4


class KubeError(BackendError):
    """An API server answer other than 2xx (status 0 = no answer at all)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"API server: {status} {reason}: {message}" if status else f"API server: {message}")
        self.status = status
        self.reason = reason


def _error(status: int, data: bytes) -> KubeError:
    reason, message = "", data.decode(errors="replace")[:500]
    try:
        body = json.loads(data)
        reason, message = str(body.get("reason", "")), str(body.get("message", message))
    except ValueError:
        pass
    return KubeError(status, reason, message)


def load_configuration(kubeconfig: str | None, context: str | None) -> k8s_client.Configuration:
    """In-cluster when ``kubeconfig`` is None and a ServiceAccount is mounted,
    else the kubeconfig file (None = the client's default lookup)."""
    cfg = k8s_client.Configuration()
    if kubeconfig is None:
        try:
            k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            return cfg
        except ConfigException:
            pass
    try:
        k8s_config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError) as e:
        raise PermanentBackendError(f"cannot load Kubernetes configuration: {e}") from e
    return cfg


class KubeClient:
    """The API server as JSON dicts: requests on a bounded thread pool, watch and exec streams on aiohttp."""

    def __init__(self, cfg: k8s_client.Configuration, *, threads: int = 16, timeout: float = 30.0) -> None:
        cfg.connection_pool_maxsize = max(threads, 4) + _URGENT_THREADS
        self.cfg = cfg
        self.timeout = timeout
        self._api = k8s_client.ApiClient(cfg)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sandboxd-kube")
        # A lane of its own for requests a caller waits on (lease records on
        # Acquire): a pool warming up queues hundreds of Pod creates on the
        # main lane, and an Acquire must not wait behind them.
        self._urgent = ThreadPoolExecutor(
            max_workers=_URGENT_THREADS, thread_name_prefix="sandboxd-kube-urgent"
        )
        self._session: aiohttp.ClientSession | None = None
        self._ssl: ssl.SSLContext | bool | None = None

    # -- request/response (thread pool) ------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
        urgent: bool = False,
    ) -> Json:
        """The JSON answer (``{}`` when empty); KubeError for a non-2xx one (status 0: no answer at all).
        ``urgent`` requests, a caller waiting on them, get a lane of their own."""
        loop = asyncio.get_running_loop()
        call = functools.partial(self._request_sync, method, path, query, body, content_type, timeout)
        return await loop.run_in_executor(self._urgent if urgent else self._pool, call)

    def _request_sync(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None,
        body: Any,
        content_type: str,
        timeout: float | None,
    ) -> Json:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        params = self._api.param_serialize(
            method,
            path,
            query_params=[(k, v) for k, v in (query or {}).items()],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self._api.call_api(*params, _request_timeout=timeout or self.timeout)
            data = response.read()  # type: ignore[no-untyped-call]
        except Exception as e:  # urllib3 and ssl errors: no answer at all
            raise KubeError(0, "", f"{method} {path}: {e}") from e
        if not 200 <= response.status < 300:
            raise _error(response.status, data or b"")
        return json.loads(data) if data else {}

    # -- streams (aiohttp) -------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext | bool:
        if self._ssl is None:
            cfg = self.cfg
            if not cfg.host.startswith("https"):
                self._ssl = False
            else:
                ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
                if not cfg.verify_ssl:
                    ctx.check_hostname = False
                    ctx.verify_mode = ssl.CERT_NONE
                elif cfg.assert_hostname is False:
                    ctx.check_hostname = False
                if cfg.cert_file:
                    ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
                self._ssl = ctx
        return self._ssl

    def auth_headers(self) -> dict[str, str]:
        """The bearer token header for a stream, read afresh each time; empty when there is no token."""
        token = self.cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
        return {"Authorization": token} if token else {}

    def session(self) -> aiohttp.ClientSession:
        """The one aiohttp session for streams, with the client's TLS; made again after it is closed."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl_context(), limit=0)
            self._session = aiohttp.ClientSession(connector=connector, read_bufsize=1 << 22)
        return self._session

    def url(self, path: str, query: Mapping[str, Any] | list[tuple[str, Any]] | None = None) -> str:
        """The full URL of ``path`` on the API server; a list ``query`` may repeat a key (exec's command)."""
        qs = urlencode(list(query.items()) if isinstance(query, Mapping) else (query or []))
        return f"{self.cfg.host}{path}" + (f"?{qs}" if qs else "")

    async def watch(self, path: str, query: Mapping[str, Any]) -> AsyncIterator[Json]:
        """Streams watch events ({"type", "object"}) until the server ends
        the watch; raises KubeError (410 = resourceVersion too old)."""
        params = {**query, "watch": "true", "allowWatchBookmarks": "true"}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout, sock_read=None)
        try:
            async with self.session().get(
                self.url(path, params), headers=self.auth_headers(), timeout=timeout
            ) as response:
                if response.status != 200:
                    raise _error(response.status, await response.read())
                async for line in response.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        obj = event.get("object") or {}
                        raise KubeError(
                            int(obj.get("code") or 500),
                            str(obj.get("reason", "")),
                            str(obj.get("message", "")),
                        )
                    yield event
        except aiohttp.ClientError as e:
            raise KubeError(0, "", f"watch {path}: {e}") from e

    async def close(self) -> None:
        """Closes the stream session, the ApiClient and both thread pools, not waiting for requests."""
        if self._session is not None:
            await self._session.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._api.close)
        self._pool.shutdown(wait=False)
        self._urgent.shutdown(wait=False)


def transient(e: KubeError) -> bool:
    """Whether asking again may succeed: no answer, a conflict (409), throttling (429) or a 5xx."""
    return e.status == 0 or e.status in (409, 429) or e.status >= 500


def unreachable(e: KubeError) -> bool:
    """The API server did not answer, or answered that it cannot now: the
    request says nothing about the object it was about."""
    return e.status in (0, 429, 502, 503, 504)


def unavailable(e: KubeError, what: str) -> TransientBackendError:
    """The error for an API server that is unreachable right now; ``what`` says what could not be done."""
    return TransientBackendError(f"the Kubernetes API server is unavailable; {what} (retry): {e}")


def wrap(e: KubeError, what: str) -> BackendError:
    """``e`` as sandboxd's error: transient when asking again may succeed, else permanent."""
    cls = TransientBackendError if transient(e) else PermanentBackendError
    return cls(f"{what}: {e}")


async def idempotent(call: Callable[[], Awaitable[T]], *, attempts: int = 4, within: float = 8.0) -> T:
    """Runs ``call`` (a request that may safely run twice: GET, a merge
    PATCH, DELETE) again on answers worth retrying (no answer, 409, 429, 5xx),
    with jittered exponential backoff, at most ``attempts`` times and for
    about ``within`` seconds; then raises the last KubeError."""
    retrying = AsyncRetrying(
        retry=retry_if_exception(lambda e: isinstance(e, KubeError) and transient(e)),
        stop=stop_after_attempt(attempts) | stop_after_delay(within),
        wait=wait_random_exponential(multiplier=0.1, max=2.0),
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await call()
    raise AssertionError("unreachable")  # reraise=True raises the last error
