"""The documentation site: it builds strict (warnings are errors, internal
links and anchors checked), its reference has an entry for every proto RPC and
message and every public client method, and it renders in a real browser."""

from __future__ import annotations

import dataclasses
import functools
import http.server
import importlib
import logging
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandboxd.v1
from sandboxd import client as client_pkg
from sandboxd.client.rollouts import RolloutClient

# The first test pays for the build (mkdocstrings reads the package with
# griffe): about 20 s on two busy cores, more under a full suite's load.
pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once per module exactly as a maintainer builds it."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, f"strict docs build failed:\n{done.stdout}\n{done.stderr}"
    return out


def _html(site: Path, page: str) -> str:
    return (site / page / "index.html").read_text()


def _proto_modules() -> list[object]:
    return [
        importlib.import_module(f"sandboxd.v1.{m.name}")
        for m in pkgutil.iter_modules(sandboxd.v1.__path__)
        if m.name.endswith("_pb2")
    ]


def test_every_rpc_and_message_has_a_reference_entry(site: Path) -> None:
    """The compiled descriptors, not the generator's own parse, say what must be there."""
    pages = "".join(p.read_text() for p in (site / "reference" / "grpc").glob("*/index.html"))
    wanted: list[str] = []
    for module in _proto_modules():
        fd = module.DESCRIPTOR  # type: ignore[attr-defined]
        for service in fd.services_by_name.values():
            wanted.append(service.full_name)
            wanted.extend(method.full_name for method in service.methods)
        todo = list(fd.message_types_by_name.values())
        while todo:
            message = todo.pop()
            if message.GetOptions().map_entry:
                continue
            wanted.append(message.full_name)
            todo.extend(message.nested_types)
        wanted.extend(e.full_name for e in fd.enum_types_by_name.values())
    assert len(wanted) > 100
    missing = [name for name in wanted if f'id="{name}"' not in pages]
    assert not missing, f"no reference entry for {missing}"


def _public_members(cls: type) -> list[str]:
    names = []
    for klass in cls.__mro__:
        if klass is object or klass.__module__.startswith(("builtins", "typing")):
            continue
        names.extend(n for n in vars(klass) if not n.startswith("_"))
        if dataclasses.is_dataclass(klass):
            names.extend(f.name for f in dataclasses.fields(klass) if not f.name.startswith("_"))
    return sorted(set(names))


def test_every_public_client_method_has_a_reference_entry(site: Path) -> None:
    """mkdocstrings omits a member without a docstring, so an undocumented
    public method fails here as surely as one left off the page."""
    page = _html(site, "reference/client")
    # Documented where users import them from.
    classes = {f"sandboxd.client.{name}": getattr(client_pkg, name) for name in client_pkg.__all__}
    classes["sandboxd.client.rollouts.RolloutClient"] = RolloutClient
    missing = []
    for path, cls in classes.items():
        members = _public_members(cls)
        assert members or cls is client_pkg.Client, cls
        missing += [f"{path}.{name}" for name in members if f'id="{path}.{name}"' not in page]
        if f'id="{path}"' not in page:
            missing.append(path)
    assert 'id="sandboxd.client.rollouts.trajectory"' in page
    assert not missing, f"no reference entry for {missing}"


def test_an_rpc_without_a_comment_fails_the_build(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sys.path.insert(0, str(ROOT / "scripts" / "docs"))
    try:
        proto_reference = importlib.import_module("proto_reference")
    finally:
        sys.path.remove(str(ROOT / "scripts" / "docs"))
    (tmp_path / "x.proto").write_text(
        'syntax = "proto3";\npackage sandboxd.v1;\n\n'
        "// Documented.\nservice S {\n  // Has one.\n  rpc A(M) returns (M);\n"
        "  rpc B(M) returns (stream M);\n}\n\nmessage M { int32 n = 1; }  // trailing\n"
    )
    reference = proto_reference.Reference(tmp_path)
    assert reference.rpcs() == ["sandboxd.v1.S.A", "sandboxd.v1.S.B"]
    with caplog.at_level(logging.WARNING, logger="mkdocs"):
        page = reference.page(reference.files[0])
    assert [r.getMessage() for r in caplog.records] == ["proto reference: rpc sandboxd.v1.S.B has no comment"]
    assert "rpc B(M) returns (stream M);" in page
    assert "response: [`M`](x.md#sandboxd.v1.M)" in page
    assert "| `n` = 1 | `int32` | trailing |" in page


# -- in a real browser --------------------------------------------------------


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists() and shutil.which("chromium")):
        pytest.skip("Debian's chromium and chromium-driver are not installed (scripts/setup.sh test)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _open(driver: object, url: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)  # type: ignore[attr-defined]
    WebDriverWait(driver, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")


def _visible(driver: object, css: str) -> list[object]:
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, css)  # type: ignore[attr-defined]
    return [e for e in found if e.is_displayed()]


@pytest.mark.parametrize(
    ("page", "title", "anchor"),
    [
        ("", "sandboxd", ""),
        ("training/client/", "The client", "leases-that-look-after-themselves"),
        ("reference/grpc/sandboxes/", "sandboxes.proto", "sandboxd.v1.SandboxService.Acquire"),
        ("reference/client/", "Python client", "sandboxd.client.AsyncClient.acquire"),
    ],
)
def test_page_renders_in_a_browser(browser: object, served: str, page: str, title: str, anchor: str) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, f"{served}/{page}")
    assert browser.title.startswith(title), browser.title  # type: ignore[attr-defined]
    h1 = _visible(browser, "article h1")
    assert h1 and h1[0].text.startswith(title)  # type: ignore[attr-defined]
    # The navigation: the site's sections, each a link that leads somewhere.
    nav = browser.find_element(By.CSS_SELECTOR, "nav.md-nav--primary")  # type: ignore[attr-defined]
    labels = nav.get_attribute("textContent")
    for section in ("Training with sandboxd", "Operating sandboxd", "How sandboxd works", "Reference"):
        assert section in labels, labels
    # A code block, rendered and highlighted, with its copy button.
    code = _visible(browser, "article pre code, article .doc-signature code")
    assert code, "no visible code block"
    assert code[0].text.strip()  # type: ignore[attr-defined]
    if anchor:
        target = browser.find_element(By.ID, anchor)  # type: ignore[attr-defined]
        assert target.is_displayed()


def test_metrics_page_names_only_metrics_the_code_exports() -> None:
    """A metric renamed in the code fails here until its operator page follows."""
    page = (ROOT / "docs" / "operating" / "metrics-and-alerts.md").read_text()
    names = set(re.findall(r"\bsandboxd_[a-z_]*[a-z]\b", page))
    assert len(names) > 20
    source = "\n".join(p.read_text() for p in (ROOT / "sandboxd").rglob("*.py"))
    # Pool gauges are registered by their suffix under the sandboxd_pool_ prefix.
    missing = [
        n for n in sorted(names) if n not in source and f'"{n.removeprefix("sandboxd_pool_")}"' not in source
    ]
    assert not missing, f"the metrics page names metrics the code does not export: {missing}"
