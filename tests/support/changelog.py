"""CHANGELOG.md's entries and components/schema.lock, the component schema's fingerprints per
CHANGELOG version (components/schema.py `fingerprints`).

`record()` is what `python -m tests.golden` runs: while the newest CHANGELOG entry is
`Unreleased` it re-records that version's fingerprints; once the entry is dated (released) the
fingerprints are frozen, and a schema that differs needs a new entry first
(tests/test_changelog.py fails until it has one, naming the changed types).

Re-recording is no description: `unreleased_gaps()` holds the Unreleased entry's text (and its
docs/upgrading.md section) to every component and type whose fingerprint differs from the last
*released* version's. That baseline, not what the lock held at the last commit: the entry says
what changed since the release (https://keepachangelog.com/en/1.1.0/), a released version's
fingerprints never change, and the check needs no git history; compared with the last commit's
lock, a change committed together with its re-recorded lock would compare equal from the next
commit on, and nothing would ever ask for its words.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHANGELOG = ROOT / "CHANGELOG.md"
LOCK = ROOT / "components" / "schema.lock"
UPGRADING = ROOT / "docs" / "upgrading.md"
RECORD_COMMAND = ".venv/bin/python -m tests.golden"
UNRELEASED = "Unreleased"

# A version heading as Keep a Changelog writes one (https://keepachangelog.com/en/1.1.0/):
# `## [1.2.0] - 2026-12-04`, or `## [1.2.0] - Unreleased` for the one being made.
_HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\] - (?P<when>.+?)\s*$", re.M)
_SEMVER = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$")
_ABOUT = ("The component schema's fingerprint per CHANGELOG.md version, by component and type "
          "(components/schema.py fingerprints). Written by `python -m tests.golden` for an Unreleased "
          "entry only; a released version's is never rewritten.")


@dataclass(frozen=True)
class Entry:
    version: str
    released: date | None
    """None: `Unreleased`."""

    @property
    def key(self) -> tuple[int, int, int]:
        return semver(self.version)


def semver(version: str) -> tuple[int, int, int]:
    m = _SEMVER.match(version)
    if not m:
        raise ValueError(f"{version!r} is not MAJOR.MINOR.PATCH (https://semver.org/)")
    return int(m[1]), int(m[2]), int(m[3])


def entries(text: str | None = None) -> list[Entry]:
    """CHANGELOG.md's version entries, in file order (newest first when well formed)."""
    text = CHANGELOG.read_text() if text is None else text
    out = []
    for m in _HEADING.finditer(text):
        when = m["when"]
        out.append(Entry(m["version"], None if when == UNRELEASED else date.fromisoformat(when)))
    return out


def read_lock(path: Path = LOCK) -> dict[str, dict[str, str]]:
    """The recorded fingerprints, by version."""
    if not path.exists():
        return {}
    return dict(json.loads(path.read_text())["versions"])


def write_lock(versions: dict[str, dict[str, str]], path: Path = LOCK) -> None:
    ordered = dict(sorted(versions.items(), key=lambda kv: semver(kv[0]), reverse=True))
    path.write_text(json.dumps({"about": _ABOUT, "versions": ordered}, indent=2) + "\n")


@dataclass(frozen=True)
class Changes:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.added + self.removed + self.changed))

    def __bool__(self) -> bool:
        return bool(self.names)

    def describe(self) -> str:
        parts = [f"{what}: {', '.join(names)}" for what, names in
                 (("added", self.added), ("removed", self.removed), ("changed", self.changed)) if names]
        return "; ".join(parts)


def changes(old: dict[str, str], new: dict[str, str]) -> Changes:
    """The components and types added, removed or whose shape changed from `old` to `new`."""
    return Changes(tuple(sorted(set(new) - set(old))), tuple(sorted(set(old) - set(new))),
                   tuple(sorted(k for k in set(old) & set(new) if old[k] != new[k])))


def drift(current: dict[str, str], text: str | None = None,
          lock: dict[str, dict[str, str]] | None = None) -> str | None:
    """Why the schema (`current` fingerprints) does not match the newest CHANGELOG entry's
    recorded one, naming the changed types and the fix; None when it matches."""
    found = entries(text)
    if not found:
        return "CHANGELOG.md has no version entry (`## [X.Y.Z] - YYYY-MM-DD` or `- Unreleased`)"
    newest = found[0]
    lock = read_lock() if lock is None else lock
    recorded = lock.get(newest.version)
    if recorded is None:
        return (f"components/schema.lock records no schema for CHANGELOG.md's newest entry [{newest.version}]: "
                f"re-record with `{RECORD_COMMAND}`")
    diff = changes(recorded, current)
    if not diff:
        return None
    if newest.released is None:
        return (f"the component schema changed since CHANGELOG.md's entry [{newest.version}] (Unreleased) was "
                f"recorded ({diff.describe()}): say so in that entry (and in docs/upgrading.md) and re-record "
                f"with `{RECORD_COMMAND}`")
    return (f"the component schema changed since release [{newest.version}] ({newest.released}) "
            f"({diff.describe()}): add a CHANGELOG.md entry `## [X.Y.Z] - Unreleased` above it (a new major "
            f"version if a change breaks a program, semver) and re-record with `{RECORD_COMMAND}`")


def record(current: dict[str, str], text: str | None = None, path: Path = LOCK) -> str:
    """Record `current` for the newest CHANGELOG entry if it is Unreleased (what `python -m
    tests.golden` does); a released entry's fingerprints are left as they are. Returns what it did."""
    found = entries(text)
    if not found:
        return "CHANGELOG.md has no version entry: schema.lock left alone"
    newest, lock = found[0], read_lock(path)
    if newest.released is not None and newest.version in lock:
        why = drift(current, text, lock)
        return why or f"schema.lock: [{newest.version}] is released and matches"
    if lock.get(newest.version) == current:
        return f"schema.lock: [{newest.version}] unchanged"
    write_lock(lock | {newest.version: current}, path)
    return f"wrote {path} ([{newest.version}])"


def upgrade_section(version: str, text: str | None = None) -> str:
    """The `## To <version>` section of docs/upgrading.md ('' if none), without its HTML comments
    (a placeholder naming a component is no note on it)."""
    text = UPGRADING.read_text() if text is None else text
    m = re.search(rf"^## To {re.escape(version)}\s*$(?P<body>.*?)(?=^## |\Z)", text, re.M | re.S)
    return re.sub(r"<!--.*?-->", "", m["body"], flags=re.S) if m else ""


def entry_text(version: str, text: str | None = None) -> str:
    """The body of CHANGELOG.md's `## [<version>]` entry ('' if none), without HTML comments."""
    text = CHANGELOG.read_text() if text is None else text
    m = re.search(rf"^## \[{re.escape(version)}\][^\n]*$(?P<body>.*?)(?=^## |^\[[^\]]+\]: |\Z)", text, re.M | re.S)
    return re.sub(r"<!--.*?-->", "", m["body"], flags=re.S) if m else ""


def last_release(lock: dict[str, dict[str, str]], text: str | None = None) -> str | None:
    """The newest released (dated) CHANGELOG entry below the newest one that the lock records."""
    found = entries(text)
    return next((e.version for e in found[1:] if e.released is not None and e.version in lock), None)


def unnamed(names: tuple[str, ...] | list[str], text: str) -> list[str]:
    """The names that `text` does not mention as a word (`Monitoring` is not named by
    `MonitoringSectionArgs`)."""
    return [n for n in names if not re.search(rf"(?<![A-Za-z0-9]){re.escape(n)}(?![A-Za-z0-9])", text)]


def unreleased_gaps(current: dict[str, str], text: str | None = None, lock: dict[str, dict[str, str]] | None = None,
                    upgrading: str | None = None) -> str | None:
    """Why the Unreleased entry (newest, undated) does not describe the schema `current`: the
    components and types added, removed or changed since the last release that its text, or its
    docs/upgrading.md section (`## To <version>`), does not name. None when both name every one,
    or when the newest entry is released (then `drift` holds the schema to its fingerprints)."""
    found = entries(text)
    if not found or found[0].released is not None:
        return None
    lock = read_lock() if lock is None else lock
    newest, base = found[0].version, last_release(lock, text)
    if base is None:
        return None
    diff = changes(lock[base], current)
    missing = [(f"CHANGELOG.md's [{newest}] entry", unnamed(diff.names, entry_text(newest, text))),
               (f"docs/upgrading.md's `## To {newest}`", unnamed(diff.names, upgrade_section(newest, upgrading)))]
    said = [f"{where} does not name {', '.join(names)}" for where, names in missing if names]
    if not said:
        return None
    return (f"the component schema changed since release [{base}] ({diff.describe()}), and " + "; ".join(said)
            + ": say what changed for each (what to change in a program, in docs/upgrading.md), naming it; "
            "re-recording components/schema.lock is no description")
