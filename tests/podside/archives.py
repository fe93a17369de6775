"""Objects a publisher could have written, and objects it never would: for restore's refusals.

`forge` builds the archive layout compile_cache.build_archive writes (files, then the manifest
as the last member); `put` uploads it with every metadata field the publisher sets, so a test
that drops or changes one field, or one member, is refused for that reason alone.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from typing import Any, Callable

from tests.podside.servers import BUCKET, S3Server
from warmstart.podside.compile_cache import node as compile_cache_node
from warmstart.podside.compile_cache import main as cc


def manifest_entries(files: dict[str, bytes]) -> list[list[Any]]:
    return [[name, len(data), hashlib.sha256(data).hexdigest(), False] for name, data in sorted(files.items())]


def forge(files: dict[str, bytes], key_hash: str, *, manifest: list[list[Any]] | None | str = "auto",
          before_manifest: Callable[[tarfile.TarFile], None] | None = None) -> bytes:
    """A gzip tar of `files`, then whatever `before_manifest` adds, then the manifest (`auto`:
    the true one for `files`; None: no manifest; a list: that list)."""
    import json

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if before_manifest is not None:
            before_manifest(tar)
        if manifest is not None:
            entries = manifest_entries(files) if manifest == "auto" else manifest
            body = json.dumps({"format": cc.FORMAT_VERSION, "factors_sha256": key_hash, "files": entries}).encode()
            info = tarfile.TarInfo(cc.MANIFEST_MEMBER)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def metadata(body: bytes, key_hash: str) -> dict[str, str]:
    """What the publisher records with an object."""
    return {"warmstart-sha256": hashlib.sha256(body).hexdigest(), "warmstart-bytes": str(len(body)),
            "warmstart-format": str(cc.FORMAT_VERSION), "warmstart-factors-sha256": key_hash}


def put(server: S3Server, key: str, body: bytes, *, drop: tuple[str, ...] = (), **changes: str) -> None:
    """Upload `body` under `key` with the publisher's metadata, less `drop`, with `changes`
    (underscores for dashes: warmstart_format="1")."""
    key_hash = compile_cache_node.key_digest(key)
    meta = {k: v for k, v in metadata(body, key_hash).items() if k not in drop}
    meta.update({k.replace("_", "-"): v for k, v in changes.items()})
    server.client().put_object(Bucket=BUCKET, Key=key, Body=body, Metadata=meta)
