"""Stage one model version's weights on this node's NVMe, and say so with a node label.

Runs in the model's own image (standard library, and the image's boto3 for HeadObject where it
has one; the copier is the s5cmd binary an init container copies in), in a DaemonSet pod on
every GPU node of a pool:

    python3 /opt/warmstart/weights_stage.py stage   # init container: one staging attempt
    python3 /opt/warmstart/weights_stage.py hold    # main container: label, watch, retry, unlabel

Nothing here can fail a deploy or a node: every outcome is one JSON line and exit status 0. A
node without a complete copy simply has no label, and its serving pods stream from S3.

Life of a copy (all under WARMSTART_WEIGHTS_ROOT = the node's `<nvme>/weights/<model>`):
1. list the source (`s5cmd ls`); refuse an empty listing or one without safetensors;
2. check free space: the copy must leave the kubelet's eviction threshold free, or it is
   refused before a byte is written (no DiskPressure, the previous copy untouched);
3. wait while a serving pod on this node streams from S3 (it writes `.loading/<uid>.json`,
   see weights_select.py): the first pod on a new node keeps the whole network link;
4. `s5cmd sync --size-only` into `<digest>.partial/`, stopped (and later resumed, sync skips
   what is complete) whenever a serving pod starts streaming, under an overall deadline; the
   listing the copy is made from is kept in the partial directory, and a resume first drops
   files whose ETag has changed since (same-size shards of another revision);
5. verify against a FRESH listing: same keys, sizes AND ETags as before the copy (a source
   rewritten during the copy is refused), every file a regular file with its size, and nothing
   else (s5cmd's temporary files, planted links and FIFOs are removed);
6. check the content against what S3 vouches for (check_content): the import manifest's sha256
   where it names the file with this ETag, else S3's ChecksumSHA256, else the ETag recomputed
   from the bytes where S3 computed it from them (not SSE-KMS or SSE-C: HeadObject says): the
   MD5, or the MD5 of the parts' MD5s for a multipart object, its part size known (manifest,
   S3's PartsCount) or derived as S3 clients choose it; a mismatch is refused and the copy
   dropped; a file nothing vouches for is "unverifiable", handled per WARMSTART_CONTENT_CHECK
   and never copied again for it;
7. write `.warmstart-complete.json` (keys, sizes, ETags, how each was checked, bytes, seconds),
   fsync every file and the directory, rename `<digest>.partial` -> `<digest>`;
8. garbage-collect: keep the current digest and the newest previous complete one (a rollback),
   remove older ones and stale partials of other digests. Nothing is removed before step 7.
A failed or interrupted attempt never renames: a partial copy is never used. A mismatch or a
full disk (during the copy or at the marker) removes the partial copy; a deadline, a signal or a
failed s5cmd run keeps it to be resumed.

Under faults (anything that can write the node directory can plant files in it): every read
there is opened without following links and without blocking (O_NOFOLLOW | O_NONBLOCK), must be
a regular file, and is bounded (a marker at 1 MiB, a pause request at 4 KiB, 256 requests);
`.loading` is read through its own descriptor, so a planted link never makes the stager delete
elsewhere; `<digest>.partial` and `<digest>` are real directories under the root (a planted link
is removed, never followed). A pause request counts for at most WARMSTART_MAX_PAUSE_S past its
file's time and now, and pauses take at most half of an attempt's deadline. SIGTERM: s5cmd gets
2 s, the unlabel call 5 s, inside the pod's 30 s grace period.

Environment:

    WARMSTART_WEIGHTS_SOURCE     s3://bucket/prefix of the version. Required.
    WARMSTART_WEIGHTS_DIGEST     its digest (the directory and label value). Required.
    WARMSTART_WEIGHTS_ROOT       the model's node weights directory. Default /weights.
    WARMSTART_S5CMD              the copier. Default /opt/s5cmd/s5cmd.
    WARMSTART_STAGE_DEADLINE_S   overall deadline of one attempt (listing, waits, copy). Default 3600.
    WARMSTART_STAGE_WORKERS      s5cmd --numworkers. Default 64.
    WARMSTART_MIN_FREE_SHARE     share of the filesystem that must stay free. Default 0.15.
    WARMSTART_POLL_S             how often pause requests are checked. Default 1.
    WARMSTART_MAX_PAUSE_S        the longest one pause request counts for. Default 1200.
    WARMSTART_CONTENT_CHECK      (the stack key models[].nodeCacheContentCheck) `auto` (default):
                                 step 6, an unverifiable file kept on its size and ETag agreement
                                 and named in the outcome line; `etag`, `sha256`: an unverifiable
                                 file (`sha256`: one without a sha256) refuses the copy, which is
                                 kept, logged once; `size`: sizes and ETag agreement only.
    WARMSTART_RETRY_S            hold: wait between failed attempts. Default 300.
    WARMSTART_LABEL              node label key, e.g. weights.warmstart.io/<model>. Empty: no label.
    WARMSTART_KUBE_API           API server URL. Default https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.
    WARMSTART_SA_DIR             service-account token dir. Default /var/run/secrets/kubernetes.io/serviceaccount.
    NODE_NAME, POD_NAME, POD_UID, POD_NAMESPACE   downward API.
    AWS_ENDPOINT_URL             passed to s5cmd as --endpoint-url (tests, S3-compatible stores).

Log line, one per outcome, on stdout:

    {"event":"warmstart.weights_stage","phase":"stage","result":"staged","digest":"...","bytes":1,
     "files":1,"seconds":1.0,"paused_s":0.0,"reason":null}

    stage results: staged | present (already complete) | refused (listing, size, ETag, content,
                   space, unverifiable) | deferred
                   (deadline while waiting) | error
    label results: labelled | unlabelled | skipped | error

Files (one ConfigMap folder, warmstart/manifests/pod_scripts.py): this one has the attempt
(stage), the hold loop and the command line; weights_stage_settings.py the names, Settings, the
outcome line and the deadline; weights_stage_node.py the node directory (bounded reads, safe
removal and writes, the lock, pause requests, the marker, garbage); weights_stage_copy.py the
listing, the sync, the verification and the promotion; weights_stage_content.py the content
check; weights_stage_label.py the NodeFeature; podside_common.py what every pod script shares.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import sys
import time
from typing import Any, Callable, Mapping

# The names the code below uses; a caller imports each from the module that defines it.
from .content import check_content, KeptRefusal, LOGGED_MEMOS, content_memo_key, UNVERIFIABLE_MEMO
from .copy import copy, list_source, prepare_partial, promote, verify
from .label import label
from .node import check_space, collect_garbage, complete, NodeLock, parse_json, read_small, remove, write_file
from .settings import (
    Deadline, emit, IMPORT_MANIFEST, MAX_MARKER_BYTES, PARTIAL_SUFFIX, Settings, StageRefused, UNLABEL_TIMEOUT_S,
)

def stage(settings: Settings | None = None, *, emit_line: bool = True) -> dict[str, Any]:
    """One staging attempt. Never raises (a KeyboardInterrupt/SystemExit is logged, re-raised)."""
    start = time.monotonic()
    record: dict[str, Any] = {"phase": "stage", "result": "error", "reason": None, "paused_s": 0.0}
    try:
        settings = settings or Settings.from_env()
        record["digest"] = settings.digest
        settings.root.mkdir(parents=True, exist_ok=True)
        deadline = Deadline(settings.deadline_s)
        with NodeLock(settings.root, deadline):
            if complete(settings):
                record.update(result="present", removed=collect_garbage(settings))
            else:
                _stage_locked(settings, deadline, record, start)
    except StageRefused as exc:
        record.update(result="refused", reason=str(exc))
        if isinstance(exc, KeptRefusal) and exc.repeat:
            emit_line = False  # logged once already (the same listing, the same policy)
    except TimeoutError as exc:
        record.update(result="deferred", reason=str(exc))
    except BaseException as exc:  # noqa: BLE001 - never fail the node's DaemonSet pod
        record.update(result="error", reason=f"{type(exc).__name__}: {exc}")
        if not isinstance(exc, Exception):
            record["seconds"] = round(time.monotonic() - start, 3)
            if emit_line:
                emit(record)
            raise
    record["seconds"] = round(time.monotonic() - start, 3)
    if emit_line:
        emit(record)
    return record


def _stage_locked(settings: Settings, deadline: Deadline, record: dict[str, Any], start: float) -> None:
    before = list_source(settings, deadline)
    if not before:
        raise StageRefused(f"no objects under {settings.source}")
    if not any(k.endswith(".safetensors") for k in before):
        raise StageRefused(f"no .safetensors files under {settings.source}")
    # Stale partial copies of other digests are never used: free their space first.
    for p in settings.root.iterdir():
        if p.name.endswith(PARTIAL_SUFFIX) and p != settings.partial:
            remove(p)
    try:
        prepare_partial(settings, before)
        check_space(settings, before)
        record["paused_s"] = round(copy(settings, deadline), 3)
        after = list_source(settings, deadline)
        total = verify(settings, before, after)
        checked = _check_by_policy(settings, after, deadline, record)
        promote(settings, after, total, time.monotonic() - start, checked)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            # The copy or its marker filled the disk: give the space back (the previous
            # version is untouched, nothing was renamed).
            remove(settings.partial)
            raise StageRefused(f"disk full: {exc}") from None
        raise
    except KeptRefusal:
        raise  # nothing a new copy could change: the copy stays, to be checked as the policy allows
    except StageRefused:
        remove(settings.partial)  # a copy that does not match its source: start over
        raise
    # Stopped by the deadline, a signal or a failed s5cmd run, the partial copy is kept to be
    # resumed; its listing snapshot makes the resume drop files of another revision.
    record.update(result="staged", bytes=total, files=len(after), removed=collect_garbage(settings),
                  checked=sorted(set(checked.values())))


def _check_by_policy(settings: Settings, after: Mapping[str, Mapping[str, Any]], deadline: Deadline,
                     record: dict[str, Any]) -> dict[str, str]:
    """check_content under WARMSTART_CONTENT_CHECK: {key: how it was checked}. Files nothing can
    vouch for are named once in the outcome line (`unverifiable`); `auto` keeps them on their
    sizes and ETag agreement, `etag` and `sha256` refuse the copy but keep it (KeptRefusal), and
    a repeated attempt over the same listing refuses at once from the memo, without a re-hash."""
    memo_key = content_memo_key(settings, after)
    memo = parse_json(read_small(settings.partial / UNVERIFIABLE_MEMO, MAX_MARKER_BYTES))
    if isinstance(memo, dict) and memo.get("key") == memo_key and isinstance(memo.get("reason"), str):
        record["unverifiable"] = memo.get("files")
        repeat = memo_key in LOGGED_MEMOS
        LOGGED_MEMOS.add(memo_key)
        raise KeptRefusal(memo["reason"], repeat=repeat)
    checked, unverifiable = check_content(settings, after, deadline)
    if not unverifiable:
        return checked
    names = sorted(unverifiable)
    record["unverifiable"] = {k: unverifiable[k] for k in names[:16]} | (
        {"...": f"{len(names) - 16} more"} if len(names) > 16 else {})
    # The import's manifest cannot name its own sha256: it is never what a strict check refuses on.
    if settings.content_check == "auto" or names == [IMPORT_MANIFEST]:
        return checked | {k: "size" for k in names}
    names = [n for n in names if n != IMPORT_MANIFEST]
    reason = (f"unverifiable under WARMSTART_CONTENT_CHECK={settings.content_check}: {len(names)} file(s) "
              f"cannot be checked that way ({names[0]}: {unverifiable[names[0]]}); the copy is kept; fix: "
              "models[].nodeCacheContentCheck: auto (or size) for this bucket")
    write_file(settings.partial / UNVERIFIABLE_MEMO,
                json.dumps({"key": memo_key, "reason": reason, "files": record["unverifiable"]}).encode())
    LOGGED_MEMOS.add(memo_key)
    raise KeptRefusal(reason)


class Terminated(BaseException):
    """SIGTERM in the hold container, raised wherever it waits (a sleep, a copy)."""


def hold(settings: Settings, *, rounds: int | None = None, sleep: Callable[[float], None] = time.sleep,
         check_s: float = 30.0) -> None:
    """Keep the label true: labelled while the copy is complete, unlabelled (and restaged)
    when it is not; unlabel on SIGTERM. `rounds` bounds the loop (tests).

    SIGTERM raises Terminated wherever the loop waits (its sleep, a copy: s5cmd gets
    COPIER_STOP_S to stop), and the unlabel call has UNLABEL_TIMEOUT_S: the label is gone well
    inside the pod's 30 s terminationGracePeriodSeconds, not at the next 30 s check."""
    def on_term(*_: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one unwinding: the unlabel is not interrupted
        raise Terminated()

    if rounds is None:
        signal.signal(signal.SIGTERM, on_term)
    labelled: bool | None = None
    next_attempt = 0.0
    n = 0
    try:
        while rounds is None or n < rounds:
            n += 1
            ok = complete(settings)
            if not ok and time.monotonic() >= next_attempt:
                ok = stage(settings)["result"] in ("staged", "present")
                next_attempt = time.monotonic() + settings.retry_s
            if ok != labelled:
                record = label(settings, ok)
                emit(record)
                if record["result"] in ("labelled", "unlabelled"):
                    labelled = ok
            if rounds is None or n < rounds:
                sleep(check_s)
    except Terminated:
        pass
    if labelled:
        emit(label(settings, False, timeout=UNLABEL_TIMEOUT_S))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("stage", "hold", "label"))
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
    except (StageRefused, ValueError) as exc:
        emit({"phase": args.command, "result": "error", "reason": str(exc)})
        if args.command == "hold":
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # PID 1: no default SIGTERM action
            while True:  # keep the pod Running (no crash loop); nothing to do
                time.sleep(3600)
        return 0
    if args.command == "stage":
        stage(settings)
    elif args.command == "label":
        emit(label(settings, complete(settings)))
    else:
        hold(settings)
    return 0

