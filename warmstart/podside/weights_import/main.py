"""Copy a model's weights into its S3 `source` prefix, verify them, and record a manifest.

Why: a stack whose model bucket is created by the same `pulumi up` starts with an empty
bucket, and vLLM without weights crash-loops on a GPU node until the Deployment times out. The
import Job runs this script on a non-GPU node before the Deployment is created. It is shipped
into the pod through a ConfigMap and run with the model's own vLLM image, which has boto3 (for
the Run:ai streamer) and huggingface_hub (for Hub downloads), so there is no other image:

    python3 /opt/warmstart/weights_import.py

What it copies: only what vLLM reads, directly under the source prefix (the Run:ai streamer
does not list recursively): the `*.safetensors` weights, `*.json` config and tokenizer files,
tokenizer vocabularies (`*.model`, `*.tiktoken`, `*.txt`), chat templates (`*.jinja`) and
`*.py` for remote code. Files in sub-folders (`original/`, `onnx/`, ...) are never copied.
When the source has `model.safetensors.index.json`, the weights are exactly the shards it
names (vLLM loads only those; a `consolidated.safetensors` beside them is skipped).

How: from S3, boto3's managed transfer does server-side copies (multipart `UploadPartCopy`
above WARMSTART_PART_BYTES), many files and parts at once on one thread pool; nothing passes
through the pod. From the Hugging Face Hub, file by file (weights_import/stream.py): each file
is fetched with `huggingface_hub.hf_hub_download` into WARMSTART_SCRATCH_DIR (it honours
HF_ENDPOINT and HF_TOKEN), uploaded as a multipart upload while it is hashed, completed only when
the Hub's sha256 (or git blob id) matches and aborted otherwise, and deleted; the files in flight
never hold more than WARMSTART_SCRATCH_BYTES, and after each file the "incomplete" manifest
records it (`verified`), which is what a restarted run keeps (never a size).

Order, so that a half-done import is never taken for a whole one:
    check     the destination's manifest: if it names this source and revision and every key it
              lists is there with its size, nothing is copied (and the source is not contacted);
    plan      list the source, pick the files, and verify them BEFORE copying anything:
              config.json, at least one shard, every shard the index names, the total
              against WARMSTART_WEIGHTS_GIB, and maxModelLen against config.json;
    copy      only what is missing or differs in size at the destination (an interrupted run
              is completed by the next), each file retried WARMSTART_RETRIES times. Sizes
              cannot tell two revisions apart, so over another import everything is copied,
              and that import's manifest is first replaced by an "incomplete" one, so it never
              vouches for files that are partly this import's;
    verify    list the destination again: every file there with its source size, every shard
              of the index, the total against weightsGiB, no stray shard vLLM would load;
    manifest  `warmstart-manifest.json` next to the weights, written LAST: keys, sizes, ETags,
              total bytes, source, revision and time.

Environment (read once, in Settings.from_env):

    WARMSTART_MODEL             model name, for messages. Required.
    WARMSTART_DEST_BUCKET       bucket of the model's `source`. Required.
    WARMSTART_DEST_PREFIX       key prefix of the model's `source` (no trailing slash). Required.
    WARMSTART_WEIGHTS_GIB       the model's configured weightsGiB. Required.
    WARMSTART_SOURCE_S3         `s3://bucket/prefix` to copy from; or else
    WARMSTART_HF_REPO           a Hub repository id, with
    WARMSTART_HF_REVISION       the commit to copy (40 hex characters).
    WARMSTART_SCRATCH_DIR       Hub download directory (an emptyDir). Default /scratch.
    WARMSTART_SCRATCH_BYTES     what the Hub files in flight may hold there together (0: its free space).
    WARMSTART_FILE_PARALLELISM  Hub files downloaded and uploaded at once. Default 8.
    WARMSTART_MAX_CONCURRENCY   transfer threads (parts and files). Default 16.
    WARMSTART_PART_BYTES        multipart threshold and part size. Default 64 MiB (S3's minimum is 5 MiB).
    WARMSTART_RETRIES           attempts per file (and per Hub listing or download). Default 3.
    WARMSTART_MAX_MODEL_LEN     the model's maxModelLen: checked against its config.json as vLLM does
                                at start-up (context_length.py). Unset: not checked.
    WARMSTART_HF_OVERRIDES      the JSON object of `--hf-overrides` in the model's extraArgs, applied
                                to config.json first (vLLM applies it too).
    WARMSTART_SMALL_READ_S      the most one small JSON read (manifest, index, config) may take,
                                all its attempts together. Default 60.
    WARMSTART_TERMINATION_LOG   where the failure reason is written for `kubectl describe` and
                                `pulumi up`. Default /dev/termination-log where it exists (in a pod).
    HF_TOKEN, HF_ENDPOINT, HF_HUB_*  read by huggingface_hub itself.
    AWS_REGION, AWS_ENDPOINT_URL and the rest of the AWS environment (IRSA) are read by boto3.

Exit codes (the Job's podFailurePolicy fails the Job at once on 2, 3 and 4: a retry cannot help):

    0  imported and verified, or already complete (nothing copied)
    2  the environment is not a usable configuration, a Hub file is larger than the scratch, or
       maxModelLen is above what the model's config.json allows (vLLM would refuse to start;
       checked in `plan` before any copy, and on a complete import's own config.json)
    3  the source or destination cannot be read or written: not found, access denied, a gated
       or private Hub repository without a token that may read it, an unknown revision
    4  verification failed: no config.json, no shard, a shard the index names is missing, the
       total disagrees with weightsGiB, stray shards at the destination
    5  a transfer still failed after its retries, a small file's read was cut short on every
       attempt or took longer than WARMSTART_SMALL_READ_S, or the scratch disk is too small
    143  SIGTERM (the Job's deadline, a node drain): in-flight transfers are cancelled, nothing
       is recorded as complete, the next run resumes. A SIGTERM after the complete manifest
       reached S3 (looked up when its write was in flight) is 0: the import is complete. The
       final line says which, and what S3 holds.
    1  anything else (a bug: the log line has the exception)

Under faults: a JSON file (manifest, index, config) whose body disagrees with its Content-Length
or its listed size is read again, never taken whole; one nested deeper than MAX_JSON_DEPTH or over
MAX_JSON_BYTES is "unreadable" (an index: exit 4; the destination's manifest: it vouches for
nothing and everything is copied again). From the Hub every downloaded file is hashed against
the Hub's published sha256 (LFS files) or git blob id (the others) before any upload; from S3
the copy is server-side and S3 itself checks it (the manifest records ETags and the part size).

Log: one JSON line per phase on stdout, e.g.

    {"event":"warmstart.weights_import","phase":"copy","result":"copied","model":"llama","files":4,
     "bytes":16060522496,"seconds":93.2,"reason":null}
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any, Iterable, Mapping

# The names the code below uses; a caller imports each from the module that defines it.
from ..common.shared import exit_at_deadline, s3_code as _s3_code, s3_status as _s3_status
from .s3 import (
    CANCEL_WAIT_S, describe_error, is_permanent_s3, list_prefix, make_client, MAX_JSON_BYTES, MAX_JSON_DEPTH,
    read_json, transfer_config, Transfers, UNREADABLE,
)
from .settings import (
    AccessError, ConfigError, emit, EXIT_BUG, EXIT_OK, EXIT_TERMINATED, EXIT_TRANSFER, FORMAT, gib, ImportFailure,
    INDEX_NAME, Interrupted, MANIFEST_NAME, Phase, Settings, termination_log, VerifyError, wanted,
    WEIGHTS_TOLERANCE,
)
from .sources import HubSource, prove_by_hash, S3Source, SourceFile
from . import context_length

# --------------------------------------------------------------------------------------------
# The checks


def weights_of(names: Iterable[str], index: Any | None) -> tuple[list[str], list[str]]:
    """(the weight files vLLM loads, the other *.safetensors present): with an index, exactly
    the shards it names; without one, every top-level *.safetensors."""
    shards = sorted(n for n in names if n.endswith(".safetensors"))
    if isinstance(index, dict) and isinstance(index.get("weight_map"), dict):
        named = sorted(set(str(v) for v in index["weight_map"].values()))
        return named, [n for n in shards if n not in named]
    return shards, []


def check_weights_total(settings: Settings, total: int, where: str) -> None:
    measured, configured = gib(total), settings.weights_gib
    if abs(measured - configured) > WEIGHTS_TOLERANCE * configured:
        raise VerifyError(
            f"{settings.model}: the safetensors weights {where} total {measured:.2f} GiB ({total} bytes) but "
            f"weightsGiB is {configured:g} ({(measured - configured) / configured:+.1%}, more than the "
            f"{WEIGHTS_TOLERANCE:.0%} tolerance); fix: set weightsGiB: {measured:.2f} for model {settings.model} "
            "(the streamer concurrency, tensor parallelism and start-up budget are derived from it), or "
            "import the model you meant")


def check_files(settings: Settings, present: Mapping[str, int], index: Any | None, where: str
                ) -> tuple[list[str], list[str]]:
    """The rules a set of files (name -> bytes) must meet for vLLM; (weights, other shards)."""
    if "config.json" not in present:
        raise VerifyError(f"{settings.model}: {where} has no config.json, which vLLM needs; fix: import the "
                          "folder of a Hugging Face-format model (config.json beside the *.safetensors)")
    if isinstance(index, dict) and UNREADABLE in index:
        raise VerifyError(f"{settings.model}: {INDEX_NAME} at {where} is not a safetensors index this import reads "
                          f"({index[UNREADABLE]}); fix: import a model whose index is a safetensors index "
                          f"(at most {MAX_JSON_BYTES >> 20} MiB, nested at most {MAX_JSON_DEPTH} deep)")
    if index is not None and not (isinstance(index, dict) and isinstance(index.get("weight_map"), dict)):
        raise VerifyError(f"{settings.model}: {INDEX_NAME} at {where} is not a safetensors index (no weight_map)")
    weights, others = weights_of(present, index)
    if not weights:
        raise VerifyError(f"{settings.model}: {where} has no *.safetensors weights (the Run:ai streamer loads "
                          "only safetensors); fix: import a repository or prefix with safetensors shards")
    missing = [w for w in weights if w not in present]
    if missing:
        raise VerifyError(f"{settings.model}: {INDEX_NAME} at {where} names {len(missing)} shard(s) that are not "
                          f"there: {', '.join(missing[:8])}; fix: import a complete copy of the model")
    check_weights_total(settings, sum(present[w] for w in weights), where)
    return weights, others


def check_max_model_len(settings: Settings, config: Any, where: str) -> float | None:
    """vLLM's start-up rule for `--max-model-len` (context_length.py) on the model's config.json:
    a ConfigError (exit 2) when vLLM would refuse maxModelLen, so the manifest that lets the
    stager and the Deployment go ahead is never written for a model that cannot start. Returns
    the model's limit (None: unchecked, or the config names no length)."""
    if settings.max_model_len is None:
        return None
    if not isinstance(config, dict) or UNREADABLE in config:
        why = config[UNREADABLE] if isinstance(config, dict) else "not a JSON object"
        raise VerifyError(f"{settings.model}: config.json at {where} is not a model config vLLM reads ({why}); "
                          "fix: import a Hugging Face-format model")
    length = context_length.derive(config, settings.hf_overrides)
    line = context_length.refusal(settings.model, settings.max_model_len, length, bool(settings.hf_overrides))
    if line is not None:
        raise ConfigError(line)
    return length.limit


# --------------------------------------------------------------------------------------------
# The import


def manifest_complete(settings: Settings, manifest: Any, dest: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Why the destination is not a complete import of this source and revision (None: it is)."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return "no manifest" if manifest is None else "the manifest is not one this script wrote"
    if manifest.get("source") != settings.source or manifest.get("revision") != settings.revision:
        return f"the manifest records {manifest.get('source')}@{manifest.get('revision')}"
    if manifest.get("status") != "complete":
        return "an import of this source was interrupted"
    files = manifest.get("files")
    if not isinstance(files, list) or not files:
        return "the manifest lists no files"
    if not all(isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("bytes"), int)
               for f in files):
        return "the manifest is not one this script wrote (malformed file list)"
    index = manifest.get("index_shards")
    if index is not None and not (isinstance(index, list)
                                  and all(isinstance(n, str) and n in dest for n in index)):
        return "the manifest's index shards are malformed or missing at the destination"
    for f in files:
        have = dest.get(str(f.get("name")))
        if have is None or have["bytes"] != f.get("bytes"):
            return f"{f.get('name')} is {'missing' if have is None else 'a different size'}"
    return None


def verified_records(manifest: Any) -> dict[str, dict[str, Any]]:
    """name -> the record of a Hub file stored after its hash matched: an interrupted import's
    `verified` map, or a complete manifest's files with their sha256 (each with the Hub's hash it
    matched, its size and the ETag its object had then). Anything malformed is no record."""
    if not isinstance(manifest, dict):
        return {}
    if manifest.get("status") == "incomplete":
        found = manifest.get("verified")
        return {n: r for n, r in found.items() if isinstance(n, str) and isinstance(r, dict)} \
            if isinstance(found, dict) else {}
    files = manifest.get("files")
    if manifest.get("status") != "complete" or not isinstance(files, list):
        return {}
    return {str(f["name"]): {"bytes": f.get("bytes"), "sha256": f["sha256"], "etag": f.get("etag"),
                             "hub": f.get("hub", f["sha256"])}
            for f in files if isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("sha256"), str)}


def _put_progress(client: Any, s: Settings, progress: dict[str, Any]) -> None:
    client.put_object(Bucket=s.dest_bucket, Key=s.dest_key(MANIFEST_NAME), ContentType="application/json",
                      Body=json.dumps(progress, indent=1, sort_keys=True).encode())


def run(settings: Settings, client: Any = None) -> int:
    """The whole import; its phases log one line each. Returns the exit code (never raises
    an ImportFailure)."""
    client = client or make_client(settings)
    s = settings

    # check: a complete import of this source and revision is left alone.
    phase = Phase("check", s.model)
    try:
        dest = list_prefix(client, s.dest_bucket, s.dest_prefix)
        # A manifest that is cut short on the way is read again (read_json); one that is not a
        # document this script wrote (corrupt, nested, foreign) vouches for nothing: the import
        # goes on as over another import's files (everything copied), never fails on it.
        manifest = read_json(client, s.dest_bucket, s.dest_key(MANIFEST_NAME),
                             dest[MANIFEST_NAME]["bytes"] if MANIFEST_NAME in dest else None, s.retries,
                             s.small_read_s)
    except Exception as exc:
        return _fail(s, phase, AccessError(f"cannot read the destination {s.destination}: {describe_error(exc)}")
                     if is_permanent_s3(exc) else exc)
    why = manifest_complete(s, manifest, dest)
    same_source = isinstance(manifest, dict) and manifest.get("source") == s.source \
        and manifest.get("revision") == s.revision
    if why is None:
        weights = [str(f["name"]) for f in manifest["files"] if str(f["name"]).endswith(".safetensors")]
        index = manifest.get("index_shards")
        try:
            check_weights_total(s, sum(int(dest[w]["bytes"]) for w in (index or weights)), f"at {s.destination}")
            # maxModelLen may have changed since the import: the copy's own config.json says
            # whether vLLM would start with it (an S3 read; the source is not contacted).
            if s.max_model_len is not None:
                check_max_model_len(s, read_json(client, s.dest_bucket, s.dest_key("config.json"),
                                                 int(dest["config.json"]["bytes"]) if "config.json" in dest else None,
                                                 s.retries, s.small_read_s), s.destination)
        except Exception as exc:  # noqa: BLE001
            return _fail(s, phase, exc)
        phase.result, phase.files = "complete", len(manifest["files"])
        phase.bytes = sum(int(f["bytes"]) for f in manifest["files"])
        phase.reason = f"{s.destination} already holds {s.source}" + (f"@{s.revision}" if s.revision else "")
        emit(phase)
        emit(Phase("done", s.model, result="unchanged", files=0, bytes=0, extra={"exit_code": EXIT_OK}))
        return EXIT_OK
    phase.result, phase.reason, phase.files = ("incomplete" if manifest is not None else "absent"), why, len(dest)
    emit(phase)

    try:
        source = S3Source(s, client) if s.s3_bucket else HubSource(s, client)
    except ImportFailure as exc:
        return _fail(s, Phase("plan", s.model), exc)

    # plan: what the source has, verified before anything is written.
    phase = Phase("plan", s.model)
    try:
        listing = source.list()
        picked = {n: f for n, f in listing.items() if wanted(n)}
        index = source.read_json(INDEX_NAME, picked[INDEX_NAME].bytes) if INDEX_NAME in picked else None
        weights, skipped = check_files(s, {n: f.bytes for n, f in picked.items()}, index, f"the source {s.source}")
        # Before anything is copied: would vLLM start this model with its maxModelLen?
        limit = check_max_model_len(s, source.read_json("config.json", picked["config.json"].bytes)
                                    if s.max_model_len is not None else None, s.source)
        files = {n: f for n, f in picked.items() if n not in skipped}
        # Sizes say whether a file is there already only for a copy of this same source (its
        # manifest, "incomplete" over another import's files, says so), and then only for a file
        # whose ETag is not one that was there before it started: two revisions' shards often
        # have the same size. Files of unknown origin (no manifest: an interrupted first import,
        # an older tool, a hand copy) are proven or copied: from S3 by an ETag equal to the
        # source's (S3 computes both from the bytes), from the Hub by hashing the object against
        # the Hub's sha256 or git blob id (an S3 read instead of a Hub download).
        resumable = same_source
        replaced = (manifest.get("replacing_etags") or {}) if same_source and manifest.get("status") == "incomplete" \
            else {}
        if not isinstance(replaced, dict):  # a hand-edited or foreign manifest: trust no ETag in it
            replaced = {}

        # From the Hub a file is there only if a record written after its hash matched says so
        # (the progress manifest's `verified`, or a complete manifest's sha256) and the object
        # is still the one recorded (its ETag): never by its size.
        records = verified_records(manifest) if same_source else {}
        kept: dict[str, dict[str, Any]] = {}

        def present(n: str, f: SourceFile) -> bool:
            if n not in dest or dest[n]["bytes"] != f.bytes:
                return False
            if f.etag and dest[n]["etag"] == f.etag:
                return True
            if s.hf_repo:
                rec = records.get(n)
                if rec is not None and rec.get("hub") == (f.sha256 or f.git_sha1) and rec.get("bytes") == f.bytes \
                        and rec.get("etag") == dest[n]["etag"] and isinstance(rec.get("sha256"), str):
                    kept[n] = rec
                    return True
            elif resumable:
                return dest[n]["etag"] != replaced.get(n)
            if manifest is None and (f.sha256 or f.git_sha1):
                got = prove_by_hash(client, s.dest_bucket, s.dest_key(n), f)
                if got is not None:
                    proven[n] = got
                    return True
            return False

        proven: dict[str, str] = {}

        todo = sorted((f for n, f in files.items() if not present(n, f)), key=lambda f: f.name)
        strays = sorted(n for n in dest if n.endswith(".safetensors") and n not in files)
        if strays and index is None:
            raise VerifyError(
                f"{s.model}: {s.destination} holds *.safetensors that are not part of {s.source}: "
                f"{', '.join(strays[:8])}; vLLM (no index) would load them too; fix: delete them, e.g. "
                f"`aws s3 rm {s.destination}/{strays[0]}` (the import may not delete), and run `pulumi up` again")
    except Exception as exc:  # noqa: BLE001
        return _fail(s, phase, exc)
    phase.result, phase.files = "planned", len(files)
    phase.bytes = sum(f.bytes for f in files.values())
    phase.extra = {"to_copy": len(todo), "to_copy_bytes": sum(f.bytes for f in todo),
                   "weights_bytes": sum(files[w].bytes for w in weights), "skipped": sorted(skipped) or None,
                   "strays": strays or None}
    if s.max_model_len is not None:  # what the check compared (None: the config names no length)
        phase.extra |= {"max_model_len": s.max_model_len, "model_max_len": None if limit is None else int(limit)}
    emit(phase)

    # copy: only what is missing or differs.
    phase = Phase("copy", s.model)
    attempts = 0
    progress: dict[str, Any] | None = None
    if todo and (s.hf_repo or (manifest is not None and not same_source)):
        # Before the first byte: a manifest that says "incomplete", and (from the Hub) the resume
        # record of every file stored and verified so far. Over another import it also keeps
        # that import's manifest from vouching for files that are partly this import's.
        carried = manifest if same_source and isinstance(manifest, dict) and manifest.get("status") == "incomplete" \
            else None
        progress = {"format": FORMAT, "status": "incomplete", "model": s.model, "source": s.source,
                    "revision": s.revision,
                    "started_at": (carried or {}).get("started_at")
                    or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if carried is not None:
            progress["replacing"], progress["replacing_etags"] = carried.get("replacing"), replaced
        elif manifest is not None and not same_source:
            progress["replacing"] = {k: manifest.get(k) for k in ("source", "revision")} \
                if isinstance(manifest, dict) else None
            progress["replacing_etags"] = {n: v["etag"] for n, v in sorted(dest.items())}
        if s.hf_repo:
            progress["verified"] = dict(sorted(kept.items()))
        try:
            _put_progress(client, s, progress)
        except Exception as exc:  # noqa: BLE001
            return _fail(s, phase, AccessError(f"cannot write the manifest: {describe_error(exc)}")
                         if is_permanent_s3(exc) else exc)

    def record(stored: Any) -> None:
        """After a Hub file's object completed on a hash match: its resume record, in S3."""
        assert progress is not None
        f = files[stored.name]
        progress["verified"][stored.name] = {"bytes": stored.bytes, "sha256": stored.sha256, "etag": stored.etag,
                                             "hub": f.sha256 or f.git_sha1}
        _put_progress(client, s, progress)

    if todo:
        transfers = Transfers(client, transfer_config(s))
        try:
            attempts = source.copy(todo, transfers, record) if s.hf_repo else source.copy(todo, transfers)
        except BaseException as exc:
            ended = transfers.cancel()
            if not ended:
                phase.extra = {"cancelled_transfers": "still running after "
                                                      f"{CANCEL_WAIT_S:g} s; exiting without them"}
            if not isinstance(exc, Exception):
                phase.reason = f"interrupted: {type(exc).__name__}"
                emit(phase)
                raise
            return _fail(s, phase, exc)
        transfers.close()
    phase.result = "copied" if todo else "nothing-to-copy"
    phase.files, phase.bytes = len(todo), sum(f.bytes for f in todo)
    phase.extra = {"attempts": attempts, "kind": "s3-server-side" if s.s3_bucket else "hub-download-upload"}
    budget = getattr(source, "budget", None)
    if budget is not None:  # the scratch the Hub files in flight held at most, and its bound
        phase.extra |= {"scratch_bound_bytes": budget.total, "scratch_peak_bytes": budget.peak_used,
                        "file_parallelism": s.file_parallelism}
    emit(phase)

    # verify: the destination itself, listed again.
    phase = Phase("verify", s.model)
    try:
        dest = list_prefix(client, s.dest_bucket, s.dest_prefix)
        wrong = [n for n, f in files.items() if n not in dest or dest[n]["bytes"] != f.bytes]
        if wrong:
            raise VerifyError(f"{s.model}: after the copy {s.destination} lacks or has other sizes for "
                              f"{', '.join(sorted(wrong)[:8])}")
        dest_index = read_json(client, s.dest_bucket, s.dest_key(INDEX_NAME), int(dest[INDEX_NAME]["bytes"]),
                               s.retries, s.small_read_s) if INDEX_NAME in files and INDEX_NAME in dest else None
        check_files(s, {n: int(v["bytes"]) for n, v in dest.items() if n in files}, dest_index,
                    f"the destination {s.destination}")
    except Exception as exc:  # noqa: BLE001
        return _fail(s, phase, exc)
    phase.result, phase.files = "verified", len(files)
    phase.bytes = sum(f.bytes for f in files.values())
    emit(phase)

    # manifest: last, and only now.
    phase = Phase("manifest", s.model)
    weights_bytes = sum(files[w].bytes for w in weights)
    # A file an earlier run of this import uploaded was hashed against the Hub's sha256 before
    # its upload: the Hub's value is its sha256 as much as this run's hashes are.
    copied = {f.name for f in todo}
    sha256s = {n: f.sha256 for n, f in files.items() if f.sha256 and n not in copied and resumable} \
        | {n: str(r["sha256"]) for n, r in kept.items() if n not in copied} \
        | {n: v for n, v in proven.items() if n not in copied} | source.hashes
    record = {
        "format": FORMAT, "status": "complete", "model": s.model, "source": s.source, "revision": s.revision,
        "destination": s.destination,
        "files": [{"name": n, "key": s.dest_key(n), "bytes": int(dest[n]["bytes"]), "etag": dest[n]["etag"]}
                  | ({"sha256": sha256s[n]} if n in sha256s else {})
                  # The Hub's own hash the bytes matched (its LFS sha256, or a git file's blob id).
                  | ({"hub": files[n].sha256 or files[n].git_sha1}
                     if n in sha256s and (files[n].sha256 or files[n].git_sha1) else {}) for n in sorted(files)],
        # The part size of this run's multipart copies and uploads: with it an object's ETag
        # (the MD5 of its parts' MD5s) can be recomputed from a copy of its bytes (weights_stage).
        "part_bytes": s.part_bytes,
        "total_bytes": sum(f.bytes for f in files.values()), "weights_bytes": weights_bytes,
        "weights_gib": round(gib(weights_bytes), 4), "configured_weights_gib": s.weights_gib,
        "index_shards": weights if index is not None else None,
        "imported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "copied_files": len(todo),
    }
    # What a SIGTERM from here on reports depends on whether the manifest reached S3 (_terminated).
    _MANIFEST.update(state="writing", client=client, settings=s, imported_at=record["imported_at"])
    try:
        client.put_object(Bucket=s.dest_bucket, Key=s.dest_key(MANIFEST_NAME), ContentType="application/json",
                          Body=json.dumps(record, indent=1, sort_keys=True).encode())
    except Exception as exc:  # noqa: BLE001
        _MANIFEST["state"] = None
        return _fail(s, phase, AccessError(f"cannot write the manifest: {describe_error(exc)}")
                     if is_permanent_s3(exc) else exc)
    _MANIFEST["state"] = "written"
    phase.result, phase.files, phase.bytes = "written", len(files), record["total_bytes"]
    emit(phase)
    emit(Phase("done", s.model, result="imported", files=len(todo), bytes=sum(f.bytes for f in todo),
               extra={"exit_code": EXIT_OK}))
    return EXIT_OK


def _fail(settings: Settings | None, phase: Phase, exc: BaseException) -> int:
    """Log the phase as failed, leave the reason where Kubernetes shows it, return the exit code."""
    if isinstance(exc, ImportFailure):
        code, reason = exc.exit_code, str(exc)
    elif _s3_code(exc) or _s3_status(exc):
        code, reason = EXIT_TRANSFER, describe_error(exc)
    else:
        code, reason = EXIT_BUG, f"{type(exc).__name__}: {exc}"
    phase.result, phase.reason = "error", reason
    phase.extra = {**phase.extra, "exit_code": code}
    emit(phase)
    path = settings.termination_log if settings else termination_log(os.environ)
    if path is not None:
        try:
            path.write_text(f"weights import failed ({phase.name}): {reason}\n"[:4000])
        except OSError:
            pass
    return code


def main(argv: list[str] | None = None) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    # As PID 1 this process would ignore SIGTERM (the Job's deadline, a node drain) and hold up
    # the pod for the whole grace period: the handler unwinds the run (its transfers are
    # cancelled on the way, see Transfers) and the process exits 143 (128 + SIGTERM).
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        return _fail(None, Phase("check", os.environ.get("WARMSTART_MODEL", "?")), exc)
    try:
        code = run(settings)
    except ImportFailure as exc:
        code = _fail(settings, Phase("done", settings.model), exc)
    except Terminated:
        code = _terminated(settings)
        terminated = True
    else:
        terminated = False
    if Transfers.abandoned or code == EXIT_TERMINATED or terminated:
        # Cancelled transfers may still hold worker threads, which a normal exit joins.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


class Terminated(BaseException):
    """SIGTERM, raised in the main thread wherever it waits (a BaseException, so no
    `except Exception` on the way swallows it)."""


_MANIFEST: dict[str, Any] = {"state": None}
"""The complete manifest's write: state None (not begun, or failed), "writing" (sent, no answer
yet: S3 may hold it) or "written" (S3 answered), with what _terminated needs to look; and the
reason SIGTERM's backstop wrote (deadline_reason), for the termination log it writes next."""


def _what_s3_holds(seconds: float = 5.0) -> str | None:
    """The manifest's state as S3 has it now: "written" (this run's complete manifest is there),
    None (it is not), "unknown" (it could not be read within `seconds`)."""
    state = _MANIFEST.get("state")
    if state != "writing":
        return state
    s: Settings = _MANIFEST["settings"]
    try:
        doc = read_json(_MANIFEST["client"], s.dest_bucket, s.dest_key(MANIFEST_NAME), None, 1, seconds)
    except Exception:  # noqa: BLE001 - said as such
        return "unknown"
    ours = isinstance(doc, dict) and doc.get("status") == "complete" and doc.get("source") == s.source \
        and doc.get("revision") == s.revision and doc.get("imported_at") == _MANIFEST.get("imported_at")
    return "written" if ours else None


def _sigterm_outcome(state: str | None, settings: Settings | None, extra: str = "") -> tuple[int, str]:
    """(exit code, the final line's reason) of a SIGTERM, by what S3 holds."""
    where = f"{settings.destination} " if settings else ""
    if state == "written":
        return EXIT_OK, (f"terminated by SIGTERM after the complete manifest reached S3{extra}: {where}holds a "
                         "complete, verified import; a rerun copies nothing")
    if state == "unknown":
        return EXIT_TERMINATED, (f"terminated by SIGTERM (the Job's deadline or a node drain) while the complete "
                                 f"manifest was being written{extra}; whether S3 holds it could not be read; a rerun "
                                 "checks it and copies nothing if it does")
    return EXIT_TERMINATED, (f"terminated by SIGTERM (the Job's deadline or a node drain){extra}; {where}holds no "
                             "complete manifest (nothing was recorded as complete), a rerun resumes the copy")


def _terminated(settings: Settings) -> int:
    """The one final line after SIGTERM: what S3 holds, looked up when the manifest was in flight."""
    code, reason = _sigterm_outcome(_what_s3_holds(), settings)
    if code == EXIT_OK:
        emit(Phase("done", settings.model, result="imported", reason=reason, extra={"exit_code": EXIT_OK}))
        return EXIT_OK
    return _fail(settings, Phase("done", settings.model), Interrupted(reason))


#: After SIGTERM the process is gone by this many seconds, whatever its unwinding is doing: the
#: exception is raised wherever the main thread is, inside a library's locking too, and a
#: cancelled transfer's lock left held would hang it for good. Inside the pod's 30 s grace
#: period, after the transfers' own CANCEL_WAIT_S.
TERM_DEADLINE_S = 20.0


def _on_sigterm(*_: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one unwinding; the cleanup is not interrupted
    exit_at_deadline(TERM_DEADLINE_S, _final_at_deadline, _log_at_deadline)
    raise Terminated()


def _final_at_deadline() -> tuple[str, int]:
    """SIGTERM's backstop (podside_common.exit_at_deadline): the final record and its exit code
    (143, or 0 when the complete manifest reached S3), from what is known at the deadline."""
    state = _MANIFEST.get("state")
    code, reason = _sigterm_outcome("unknown" if state == "writing" else state, _MANIFEST.get("settings"),
                                    f"; the run did not wind down within {TERM_DEADLINE_S:g} s")
    _MANIFEST["deadline_reason"] = reason
    phase = Phase("done", os.environ.get("WARMSTART_MODEL", "?"), result="imported" if code == EXIT_OK else "error",
                  reason=reason, extra={"exit_code": code})
    return phase.line(), code


def _log_at_deadline(code: int) -> None:
    """After the backstop's line: the failure reason where Kubernetes shows it."""
    path = termination_log(os.environ)
    if path is not None and code != EXIT_OK:
        path.write_text(f"weights import failed (done): {_MANIFEST['deadline_reason']}\n")

