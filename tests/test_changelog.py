"""The public API's history: CHANGELOG.md's entries are semantic versions, newest first, the
newest is the package's version, the component schema other languages see matches the
fingerprint recorded for that entry (components/schema.lock), and docs/upgrading.md names every
component or type whose shape changed between two recorded versions."""

from __future__ import annotations

import re
from datetime import date

import pytest

from components import schema
from components.stack import LEGACY_TYPES
from tests.support import changelog
from warmstart import versions


@pytest.fixture(scope="module")
def current() -> dict[str, str]:
    return schema.fingerprints()


def test_entries_are_semantic_versions_newest_first_and_the_newest_is_the_package_version():
    found = changelog.entries()
    assert found, "CHANGELOG.md has no `## [X.Y.Z] - YYYY-MM-DD` entry"
    keys = [e.key for e in found]
    assert keys == sorted(keys, reverse=True) and len(set(keys)) == len(keys), \
        f"CHANGELOG.md's versions are not strictly newest first: {[e.version for e in found]}"
    assert all(e.released is not None for e in found[1:]), "only the newest entry may be Unreleased"
    dates = [e.released for e in found if e.released is not None]
    assert dates == sorted(dates, reverse=True) and all(d <= date.today() for d in dates)
    assert found[0].version == versions.WARMSTART_VERSION, (
        f"CHANGELOG.md's newest entry is [{found[0].version}] but warmstart/versions.py says "
        f"{versions.WARMSTART_VERSION}: give the new version its entry (or its number)")


def test_the_schema_matches_the_newest_entrys_recorded_fingerprint(current):
    why = changelog.drift(current)
    assert why is None, why


def test_every_recorded_version_has_an_entry():
    listed = {e.version for e in changelog.entries()}
    assert set(changelog.read_lock()) <= listed, "components/schema.lock records a version CHANGELOG.md lacks"


def test_the_unreleased_entry_and_its_upgrade_notes_name_every_type_changed_since_the_last_release(current):
    why = changelog.unreleased_gaps(current)
    assert why is None, why


def test_upgrading_names_every_type_that_changed_between_recorded_versions(current):
    # The Unreleased entry's fingerprints are the schema's as it is now, recorded or not.
    newest = changelog.entries()[0]
    lock = changelog.read_lock() | ({newest.version: current} if newest.released is None else {})
    ordered = sorted(lock, key=changelog.semver)
    missing = {}
    for old, new in zip(ordered, ordered[1:]):
        section = changelog.upgrade_section(new)
        unnamed = [n for n in changelog.changes(lock[old], lock[new]).names if not re.search(rf"\b{n}\b", section)]
        if unnamed:
            missing[new] = unnamed
    assert not missing, ("docs/upgrading.md does not say what to change for "
                         + "; ".join(f"`## To {v}`: {', '.join(n)}" for v, n in missing.items())
                         + ": name each changed component or type in its version's section")


def test_a_placeholder_is_no_upgrade_note():
    text = "## To 2.0.0\n\n- **VllmModel.** takes `model`.\n  <!-- lead: Network, Cluster -->\n## To 1.0.0\n\n- Network\n"
    section = changelog.upgrade_section("2.0.0", text)
    assert "VllmModel" in section and "Network" not in section and "Cluster" not in section
    assert changelog.upgrade_section("3.0.0", text) == ""


def test_the_legacy_aliases_are_listed_with_their_removal_version():
    text = changelog.UPGRADING.read_text()
    section = text[text.index("## Legacy type aliases"):text.index("## To ")]
    for layer, token in LEGACY_TYPES.items():
        assert f"`{token}`" in section, f"docs/upgrading.md's legacy aliases do not list {token} ({layer})"
    assert "removed in 2.0.0" in section


def test_the_pre_0_2_aliases_are_gone_from_2_0_0():
    """The policy docs/upgrading.md states: kept through 1.x, removed in 2.0.0."""
    pre_components = {"warmstart:aws:Network", "warmstart:aws:Storage", "warmstart:aws:ModelRoles",
                      "warmstart:cluster:Cluster", "warmstart:serving:VllmModel"}
    if versions.major(versions.WARMSTART_VERSION) >= 2:
        assert not pre_components & set(LEGACY_TYPES.values()), "2.0.0 removes the pre-0.2 type aliases"
    else:
        assert pre_components == set(LEGACY_TYPES.values())


# ---------------------------------------------------------------------------------------------
# The mechanism, on a changelog and lock of its own

_UNRELEASED = "# Changelog\n\n## [1.1.0] - Unreleased\n\n## [1.0.0] - 2026-12-04\n"
_RELEASED = "# Changelog\n\n## [1.1.0] - 2026-12-05\n\n## [1.0.0] - 2026-12-04\n"


def test_a_changed_schema_is_reported_with_the_types_and_the_command(tmp_path):
    lock = {"1.1.0": {"ServedModel": "a", "PlatformArgs": "b", "Gone": "c"}}
    now = {"ServedModel": "a", "PlatformArgs": "B", "NewArgs": "d"}
    why = changelog.drift(now, _RELEASED, lock)
    assert why is not None
    assert "changed: PlatformArgs" in why and "added: NewArgs" in why and "removed: Gone" in why
    assert "ServedModel" not in why
    assert "add a CHANGELOG.md entry" in why and changelog.RECORD_COMMAND in why
    assert changelog.drift(lock["1.1.0"], _RELEASED, lock) is None


_ENTRIES = ("# Changelog\n\n## [1.1.0] - Unreleased\n\n### Changed\n\n- `ServedModel`: {said}.\n"
            "<!-- PlatformArgs: to do -->\n\n## [1.0.0] - 2026-12-04\n\n- `PlatformArgs` is new.\n\n"
            "[1.1.0]: docs/upgrading.md#to-110\n")
_UPGRADING = "# Upgrading\n\n## To 1.1.0\n\n- `ServedModel`: {said}.\n\n## To 1.0.0\n\n- `PlatformArgs`.\n"


def test_re_recording_the_lock_alone_does_not_pass_for_a_description(tmp_path):
    """The loophole this closes: with the newest entry Unreleased, `python -m tests.golden`
    re-records its fingerprints, so the schema matches them whatever the entry says. The entry's
    words are held to the last release's fingerprints instead, which re-recording cannot move."""
    released = {"ServedModel": "a", "PlatformArgs": "b", "Gone": "c"}
    now = {"ServedModel": "A", "PlatformArgs": "B", "NewArgs": "d"}
    path = tmp_path / "schema.lock"
    changelog.write_lock({"1.0.0": released, "1.1.0": released}, path)
    text, upgrading = _ENTRIES.format(said="x"), _UPGRADING.format(said="x")
    assert "wrote" in changelog.record(now, text, path)
    lock = changelog.read_lock(path)
    assert changelog.drift(now, text, lock) is None, "re-recorded: the fingerprints match"
    why = changelog.unreleased_gaps(now, text, lock, upgrading)
    assert why is not None and "since release [1.0.0]" in why
    # Named in neither: a placeholder comment is no description, and the released entry's words
    # are not this one's.
    for where in ("CHANGELOG.md's [1.1.0] entry does not name Gone, NewArgs, PlatformArgs",
                  "docs/upgrading.md's `## To 1.1.0` does not name Gone, NewArgs, PlatformArgs"):
        assert where in why, why
    said = "`PlatformArgs` takes `NewArgs`, `Gone` is removed"
    only_changelog = changelog.unreleased_gaps(now, _ENTRIES.format(said=said), lock, upgrading)
    assert only_changelog is not None and "CHANGELOG.md" not in only_changelog.split(", and ")[1]
    assert changelog.unreleased_gaps(now, _ENTRIES.format(said=said), lock, _UPGRADING.format(said=said)) is None
    # A name is a word: a longer name that contains it names something else.
    assert changelog.unnamed(["NewArgs", "Monitoring"], "`ServedModelNewArgs`, `MonitoringSectionArgs`") == [
        "NewArgs", "Monitoring"]
    # Released, the entry is what it was released with: `drift` holds the schema to it instead.
    assert changelog.unreleased_gaps(now, _RELEASED, lock, upgrading) is None


def test_recording_rewrites_an_unreleased_entry_only(tmp_path):
    path = tmp_path / "schema.lock"
    changelog.write_lock({"1.0.0": {"A": "1"}, "1.1.0": {"A": "2"}}, path)
    assert "wrote" in changelog.record({"A": "3"}, _UNRELEASED, path)
    assert changelog.read_lock(path) == {"1.0.0": {"A": "1"}, "1.1.0": {"A": "3"}}
    said = changelog.record({"A": "4"}, _RELEASED, path)
    assert changelog.read_lock(path)["1.1.0"] == {"A": "3"} and "add a CHANGELOG.md entry" in said


def test_fingerprints_ignore_descriptions_but_not_shape():
    doc = {"resources": {"warmstart:index:C": {"description": "x", "inputProperties": {
        "description": {"type": "string", "description": "a property called description"}}}}, "types": {}}
    reworded = {"resources": {"warmstart:index:C": {"description": "y", "inputProperties": {
        "description": {"type": "string", "description": "reworded"}}}}, "types": {}}
    retyped = {"resources": {"warmstart:index:C": {"description": "x", "inputProperties": {
        "description": {"type": "integer", "description": "a property called description"}}}}, "types": {}}
    assert schema.fingerprints(doc) == schema.fingerprints(reworded)
    assert schema.fingerprints(doc) != schema.fingerprints(retyped)
    assert set(schema.fingerprints(doc)) == {"C"}
