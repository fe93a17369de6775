"""What the pod-side scripts share: the bounded reader of files a pod does not trust, the JSON
reader with its nesting bound, the fields of a botocore error, the one S3 client builder, the
outcome-line emitter and SIGTERM's exit deadline.

Standard library only at import time: botocore (and boto3, where a caller asks for it) is
imported inside make_s3_client, so a script pays for it only when it talks to S3 (the
compile-cache restore sits on the pod's start-up path; its `key` command runs without boto3).
Shipped as a file of the ConfigMap folder of every script that imports it
(warmstart/manifests/pod_scripts.py), so one fix here reaches them all;
tests/pod_scripts/test_shared_code.py fails when a script grows its own copy of one again.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping


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


def make_s3_client(*, region: str | None = None, endpoint_url: str | None = None,
                   credentials: Mapping[str, str | None] | None = None, connect_timeout_s: float = 5,
                   read_timeout_s: float = 20, max_attempts: int | None = 3,
                   max_pool_connections: int | None = None, with_boto3: bool = False) -> Any:
    """An S3 client with the deadlines a pod needs: `connect_timeout_s` and `read_timeout_s` per
    socket operation (a whole request's bound is the caller's), botocore's "standard" retry mode
    with `max_attempts` (None: botocore's own default, as a Config without `retries`), and
    `max_pool_connections` when threads share the client (None: botocore's 10).

    The region is the caller's (None: botocore's chain). `endpoint_url` None lets botocore read
    AWS_ENDPOINT_URL from the process environment itself
    (https://docs.aws.amazon.com/sdkref/latest/guide/feature-ss-endpoints.html); a caller whose
    settings come from another environment than the process's passes it, and `credentials`
    (aws_access_key_id, aws_secret_access_key, aws_session_token) likewise. The addressing style
    is botocore's default for every caller: none of them sets one.

    `with_boto3`: a boto3 session's client, for a caller that hands it to boto3's transfer
    manager or reports an image without boto3 (an ImportError propagates); otherwise botocore's
    own session: the same client and credential chain (IRSA, Pod Identity, env) without
    importing boto3, whose import was a third of a compile-cache restore's wall time."""
    from botocore.config import Config

    options: dict[str, Any] = {"connect_timeout": connect_timeout_s, "read_timeout": read_timeout_s}
    if max_attempts is not None:
        # https://docs.aws.amazon.com/sdkref/latest/guide/feature-retry-behavior.html
        options["retries"] = {"max_attempts": max_attempts, "mode": "standard"}
    if max_pool_connections is not None:
        options["max_pool_connections"] = max_pool_connections
    config = Config(**options)
    keys = dict(credentials or {})
    if with_boto3:
        import boto3

        return boto3.session.Session(**keys).client("s3", region_name=region, endpoint_url=endpoint_url,
                                                    config=config)
    import botocore.session

    return botocore.session.get_session().create_client("s3", region_name=region, endpoint_url=endpoint_url,
                                                        config=config, **keys)


def json_line(record: Mapping[str, Any], *, sort_keys: bool = False) -> str:
    """A record as one compact JSON line (no newline): what the scripts' outcome lines are, and
    what `warmstart coldstart` and the tests parse."""
    return json.dumps(record, sort_keys=sort_keys, separators=(",", ":"))


def emit_line(line: Mapping[str, Any] | str, *, sort_keys: bool = False) -> None:
    """Write one outcome line to stdout and flush it, so a pod's log has it even when the
    process is killed next: `line` as given, or a record's json_line."""
    text = line if isinstance(line, str) else json_line(line, sort_keys=sort_keys)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def exit_at_deadline(deadline_s: float, final: Callable[[], tuple[str, int]],
                     after: Callable[[int], None] | None = None) -> threading.Thread:
    """SIGTERM's backstop, started from the handler: a daemon thread that, `deadline_s` from now,
    writes the line `final()` returns (with its exit code), runs `after(code)` (best effort: a
    termination log), and ends the process with that code, whatever the main thread is doing.

    The main thread may be stuck inside a library holding a lock (a cancelled transfer, a
    socket read, sys.stdout's own buffer lock), so the line is written with os.write to file
    descriptor 1, not through sys.stdout, and the process ends with os._exit, which neither
    joins threads nor runs atexit handlers
    (https://docs.python.org/3/library/os.html#os._exit). `final` runs at the deadline, so it
    reports what is true then."""
    def backstop() -> None:
        time.sleep(deadline_s)
        code = 1
        try:
            line, code = final()
            os.write(1, (line + "\n").encode())
            if after is not None:
                after(code)
        except Exception:  # noqa: BLE001 - the exit below is what matters
            pass
        finally:
            os._exit(code)

    thread = threading.Thread(target=backstop, name="warmstart-sigterm-deadline", daemon=True)
    thread.start()
    return thread
