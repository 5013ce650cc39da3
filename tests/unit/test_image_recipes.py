"""The two image recipes share one hash and one command line: the tags they
print are their recipes' hashes, and the code-judge recipe includes the base's."""

from __future__ import annotations

import hashlib
import json

import pytest

from sandboxd.images import build, codejudge


def test_a_recipe_hash_is_of_its_canonical_json() -> None:
    recipe: dict[str, object] = {"b": [2, 1], "a": "x"}
    canonical = json.dumps(recipe, sort_keys=True, separators=(",", ":")).encode()
    assert build.recipe_hash(recipe) == hashlib.sha256(canonical).hexdigest()[:12]
    assert build.recipe_hash({"a": "x", "b": [2, 1]}) == build.recipe_hash(recipe)


def test_tags_name_each_recipe() -> None:
    assert build.default_image_tag() == f"{build.DEFAULT_IMAGE_REPO}:{build.recipe_hash(build._recipe())}"
    judge = codejudge._recipe()
    assert judge["base"] == build._recipe()
    assert codejudge.code_judge_tag() == f"{codejudge.CODE_JUDGE_REPO}:{build.recipe_hash(judge)}"


@pytest.mark.parametrize(
    ("main", "tag"), [(build.main, build.default_image_tag), (codejudge.main, codejudge.code_judge_tag)]
)
def test_print_tag_builds_nothing(main: object, tag: object, capsys: pytest.CaptureFixture[str]) -> None:
    assert callable(main) and callable(tag)
    assert main(["--print-tag"]) == 0
    assert capsys.readouterr().out == f"{tag()}\n"
