"""What the pod-side scripts share: the bounded reader of files a pod does not trust, the JSON
reader with its nesting bound, and the fields of a botocore error.

Standard library only. Shipped as a file of the ConfigMap folder of every script that imports it
(warmstart/manifests/pod_scripts.py), so one fix here reaches them all.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any


def read_regular(path: Path, limit: int, dir_fd: int | None = None) -> bytes | str:
    """A regular file's bytes (at most `limit`), else why not (a str: "missing", "a symbolic
    link", "not a regular file", "over <limit> bytes", "unreadable (...)"). Opened without
    following a symbolic link (O_NOFOLLOW) and without blocking (O_NONBLOCK: a planted FIFO would
    block an open for reading until a writer came), checked to be a regular file before a byte is
    read, and never read past `limit`. Never raises OSError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return "a symbolic link" if exc.errno == errno.ELOOP else f"unreadable ({exc.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if st.st_size > limit:
            return f"over {limit} bytes"
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        raw = b"".join(chunks)
        return raw if len(raw) <= limit else f"over {limit} bytes"
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    finally:
        os.close(fd)


def depth_ok(doc: Any, limit: int) -> bool:
    """Whether no container in `doc` is nested deeper than `limit`: a walk with one iterator
    per level (no recursion, memory in the depth, not in the number of entries)."""
    stack = [iter((doc,))]
    while stack:
        for node in stack[-1]:
            if isinstance(node, (dict, list)):
                if len(stack) > limit:
                    return False
                stack.append(iter(node.values() if isinstance(node, dict) else node))
                break
        else:
            stack.pop()
    return True


def parse_json(raw: bytes, max_depth: int) -> tuple[Any, str | None]:
    """(document, None), or (None, why) for what is not JSON (not UTF-8 either), cut short, or
    nested deeper than `max_depth` (refused before Python's recursion limit). Never raises."""
    try:
        doc = json.loads(raw)  # a non-UTF-8 body is a ValueError (UnicodeDecodeError) too
    except RecursionError:
        return None, "nested too deeply"
    except ValueError as exc:
        return None, f"not JSON ({type(exc).__name__})"
    if not depth_ok(doc, max_depth):
        return None, f"nested deeper than {max_depth}"
    return doc, None


def s3_status(exc: BaseException) -> int | None:
    """The HTTP status of a botocore ClientError, else None."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return None


def s3_code(exc: BaseException) -> str | None:
    """The S3 error code of a botocore ClientError ("NoSuchKey", "AccessDenied"), else None."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return response.get("Error", {}).get("Code")
    return None
