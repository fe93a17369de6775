"""The compile-cache archive: what is published, how it is built and bounded, how a restore installs it.

Part of compile_cache.py, whose docstring has the commands, the environment and the object
layout; shipped with it as files of one ConfigMap folder (warmstart/manifests/pod_scripts.py).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import stat
import tarfile
import time
from pathlib import Path, PurePosixPath
from typing import Any, Mapping

from .node import remove_path
from .settings import (
    CacheError, ephemeral, FORMAT_VERSION, MANIFEST_MEMBER, MAX_HEADER_BYTES, Settings, STATE_DIRNAME,
)

# --------------------------------------------------------------------------------------------
# Archive: build and safe extraction


def snapshot(settings: Settings) -> dict[str, tuple[int, int, bool]]:
    """{relative path: (size, mtime_ns, executable)} of every regular file that would be published.

    Symlinks, sockets and devices are left out: compile caches are plain files, and restore
    refuses anything else, so the archive is safe to extract on any node.
    """
    files: dict[str, tuple[int, int, bool]] = {}
    for top in settings.cache_paths:
        root = settings.cache_dir / top
        if not root.is_dir() or root.is_symlink():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not ephemeral(d))
            for name in filenames:
                if ephemeral(name):
                    continue
                full = os.path.join(dirpath, name)
                try:
                    st = os.lstat(full)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    rel = os.path.relpath(full, settings.cache_dir).replace(os.sep, "/")
                    files[rel] = (st.st_size, st.st_mtime_ns, bool(st.st_mode & 0o111))
    return files


class Changed(Exception):
    """A file changed while it was archived: the cache is not stable yet."""


def build_archive(settings: Settings, files: Mapping[str, tuple[int, int, bool]], out_path: Path,
                  key_hash: str) -> list[list[Any]]:
    """A gzip tar of exactly `files`, each checked against the snapshot as it is read, then the
    manifest of what was read: [[path, bytes, sha256, executable], ...], also returned."""
    entries: list[list[Any]] = []
    with tarfile.open(out_path, "w:gz", compresslevel=6, format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(files):
            size, mtime_ns, executable = files[rel]
            try:
                f = open(settings.cache_dir / rel, "rb")
            except FileNotFoundError as exc:
                raise Changed(rel) from exc
            with f:
                st = os.fstat(f.fileno())
                if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
                    raise Changed(rel)
                data = _HashingReader(f)
                info = tarfile.TarInfo(rel)
                info.size = size
                info.mtime = mtime_ns // 1_000_000_000
                info.mode = 0o755 if executable else 0o644
                tar.addfile(info, data)
                st = os.fstat(f.fileno())
                if (st.st_size, st.st_mtime_ns) != (size, mtime_ns) or data.count != size:
                    raise Changed(rel)
                entries.append([rel, size, data.digest.hexdigest(), executable])
        body = json.dumps({"format": FORMAT_VERSION, "factors_sha256": key_hash, "files": entries},
                          separators=(",", ":")).encode()
        info = tarfile.TarInfo(MANIFEST_MEMBER)
        info.size, info.mode, info.mtime = len(body), 0o644, int(time.time())
        tar.addfile(info, io.BytesIO(body))
    return entries


class _HashingReader:
    """A file as tarfile reads it into the archive, hashed on the way (what is vouched for is
    exactly what was archived)."""

    def __init__(self, f: Any):
        self._f, self.digest, self.count = f, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self.digest.update(data)
        self.count += len(data)
        return data


def manifest_limit(settings: Settings) -> int:
    """Largest manifest accepted: a line per file of at most a long path and a sha256."""
    return 4096 + settings.max_files * 512


class BoundedTarInfo(tarfile.TarInfo):
    """Headers as tarfile parses them, refused before tarfile reads what they announce.

    tarfile reads a whole pax or GNU long-name header into memory, and a GNU sparse header's
    extension blocks into a list, whatever their size: a few KB of gzip can announce GBs. Only
    what build_archive writes is accepted: regular files and small pax headers. (`frombuf` is
    the documented constructor tarfile calls for every header block.)
    """

    @classmethod
    def frombuf(cls, buf: bytes, encoding: str, errors: str) -> "tarfile.TarInfo":
        info = super().frombuf(buf, encoding, errors)
        if info.type == tarfile.XHDTYPE:
            if info.size > MAX_HEADER_BYTES:
                raise CacheError(f"archive has a {info.size}-byte pax header (at most {MAX_HEADER_BYTES} "
                                 "accepted): not an archive this tool wrote")
        elif info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
            raise CacheError(f"archive member {info.name!r} is not a regular file (tar type {info.type!r})")
        return info


def safe_name(name: str) -> str:
    path = PurePosixPath(name)
    parts = [p for p in path.parts if p != "."]
    if path.is_absolute() or not parts or ".." in parts or "\\" in name or "\x00" in name:
        raise CacheError(f"unsafe path in archive: {name!r}")
    if parts[0] == STATE_DIRNAME:
        raise CacheError(f"archive writes into {STATE_DIRNAME}/: {name!r}")
    return "/".join(parts)


def parse_manifest(data: bytes, settings: Settings, key_hash: str) -> dict[str, tuple[int, str, bool]]:
    try:
        doc = json.loads(data)
        if doc.get("format") != FORMAT_VERSION or doc.get("factors_sha256") != key_hash:
            raise CacheError("archive manifest is for another format or other key factors")
        files = {str(rel): (int(size), str(sha), bool(executable)) for rel, size, sha, executable in doc["files"]}
    except CacheError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CacheError(f"archive manifest is unreadable: {type(exc).__name__}: {exc}") from exc
    if len(files) > settings.max_files:
        raise CacheError(f"archive manifest lists {len(files)} files, more than WARMSTART_MAX_FILES={settings.max_files}")
    return files


def install_tree(staging: Path, cache_dir: Path) -> list[Path]:
    """Move the staged cache into place, each entry with one rename on the same filesystem.

    A top-level directory the node lacks moves in whole, so readers see all of it or none of
    it. Into an existing directory, files are moved one by one and files the node already has
    are kept: cache entries are content-addressed, so an existing file is an equivalent one.
    Returns what was moved, so a failure can take it back out.
    """
    moved: list[Path] = []
    try:
        _merge(staging, cache_dir, moved, top=True)
    except BaseException:
        for path in reversed(moved):
            remove_path(path)
        raise
    return moved


def _merge(src: Path, dst: Path, moved: list[Path], *, top: bool = False) -> None:
    if not top and not os.path.lexists(dst):
        try:
            os.rename(src, dst)
            moved.append(dst)
            return
        except OSError as exc:
            # A compiler created the same directory meanwhile: merge into it instead.
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY) or not src.is_dir():
                raise
    if src.is_dir() and dst.is_dir() and not dst.is_symlink():
        for entry in sorted(os.listdir(src)):
            _merge(src / entry, dst / entry, moved)
