"""The pure per-image part of the scaling policy: announced images, their
consumption by acquires of them, and the warm target split over images."""

from __future__ import annotations

from sandboxd.core.scaling import Announcement, announced_images, consume, image_targets

OWN = "own:latest"


def test_a_target_without_announced_images_is_the_pool_image() -> None:
    assert image_targets(3, {}, OWN) == {OWN: 3}
    assert image_targets(0, {}, OWN) == {}


def test_announced_images_get_their_counts_and_the_rest_goes_to_the_own_image() -> None:
    assert image_targets(5, {"a": 2, "b": 1}, OWN) == {"a": 2, "b": 1, OWN: 2}


def test_a_capped_target_is_shared_max_min_fair() -> None:
    split = image_targets(4, {"a": 6, "b": 1, "c": 6}, OWN)
    assert sum(split.values()) == 4 and split["b"] == 1 and OWN not in split


def test_the_floor_of_the_own_image_is_kept() -> None:
    assert image_targets(4, {"a": 6}, OWN, floor=1) == {"a": 3, OWN: 1}


def test_acquires_of_an_image_consume_the_announcements_that_name_it_first() -> None:
    named = Announcement("s1", 4, due=10.0, expires=100.0, images=(("a", 3),))
    plain = Announcement("s0", 4, due=5.0, expires=100.0)
    left, covered = consume((plain, named), 2, now=6.0, image="a")
    assert covered == 2
    by_source = {a.source: a for a in left}
    assert by_source["s1"].remaining == 2 and by_source["s1"].of_image("a") == 1
    assert by_source["s0"].remaining == 4


def test_acquires_of_the_own_image_leave_image_counts_within_what_remains() -> None:
    named = Announcement("s1", 3, due=0.0, expires=100.0, images=(("a", 3),))
    left, _ = consume((named,), 2, now=1.0)
    assert left[0].remaining == 1 and left[0].of_image("a") == 1
    assert announced_images(list(left)) == {"a": 1}


def test_announced_images_add_up_across_sources() -> None:
    one = Announcement("s1", 5, 0.0, 100.0, images=(("a", 2), ("b", 3)))
    two = Announcement("s2", 2, 0.0, 100.0, images=(("a", 2),))
    assert announced_images([one, two]) == {"a": 4, "b": 3}
