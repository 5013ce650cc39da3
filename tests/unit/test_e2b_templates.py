"""E2B templates as flags and files: what each names, and the refusals of
definitions that cannot be used, each saying what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxd.e2b.connect import ConnectError
from sandboxd.e2b.pty import pty_size, pty_wrapped
from sandboxd.e2b.templates import Recipe, Template, TemplatesError, load_templates, parse_template_flags


def test_flags_name_a_pool_and_maybe_one_of_its_images() -> None:
    assert parse_template_flags(["base=py", "t=any:python:3.12-slim", "r=any:reg:5000/x/y@sha256:ab"]) == {
        "base": Template("py"),
        "t": Template("any", "python:3.12-slim"),
        "r": Template("any", "reg:5000/x/y@sha256:ab"),
    }
    for bad, says in [
        ("base", "NAME=POOL"),
        ("=py", "NAME=POOL"),
        ("base=", "NAME=POOL"),
        ("base=:img", "NAME=POOL"),
        ("base=py:", "names no image"),
        ("a b=py", "without spaces"),
    ]:
        with pytest.raises(TemplatesError, match=says):
            parse_template_flags([bad])


def test_a_templates_file_gives_templates_and_recipes(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text(
        '[templates.a]\npool = "p"\n'
        '[templates.b]\npool = "p"\nimage = "python:3.12-slim"\n'
        '[templates.c]\npool = "p"\ncontext = "ctx"\ndockerfile = "D"\nbuild_args = { K = "V" }\n'
    )
    ready, recipes = load_templates(path)
    assert ready == {"a": Template("p"), "b": Template("p", "python:3.12-slim")}
    assert recipes == [Recipe("c", "p", tmp_path / "ctx", "D", {"K": "V"})]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[templates.a]\nimage = "x"\n', "pool is required"),
        ('[templates.a]\npool = "p:q"\n', "pool is required"),
        ('[templates.a]\npool = "p"\nimage = "x"\ncontext = "c"\n', "one or the other"),
        ('[templates.a]\npool = "p"\ndockerfile = "D"\n', "need a context"),
        ('[templates.a]\npool = "p"\ncolour = "red"\n', "unknown keys"),
        ('[templates.a]\npool = "p"\ncontext = "c"\nbuild_args = { K = 1 }\n', "table of strings"),
        ("[pools]\nx = 1\n", "unknown sections"),
        ("templates = 3\n", "tables expected"),
        ("[templates\n", "is not TOML"),
    ],
)
def test_unusable_templates_files_are_refused(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "t.toml"
    path.write_text(text)
    with pytest.raises(TemplatesError, match=says):
        load_templates(path)


def test_a_missing_templates_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(TemplatesError, match="cannot read the templates file"):
        load_templates(tmp_path / "none.toml")


def test_pty_sizes_are_checked_and_reach_the_terminal() -> None:
    assert pty_size({"pty": {"size": {"rows": 24, "cols": 80}}}) == (24, 80)
    for bad in [
        {},
        {"pty": {}},
        {"pty": {"size": {"rows": 0, "cols": 80}}},
        {"pty": {"size": {"rows": True}}},
    ]:
        with pytest.raises(ConnectError) as e:
            pty_size(bad)
        assert e.value.code == "invalid_argument"
    argv = pty_wrapped("/tmp/f", "/tmp", ["/bin/bash", "-i", "-l"], 24, 80)
    assert argv[-1] == "tty > /tmp/f.tty; stty rows 24 cols 80; exec /bin/bash -i -l"
