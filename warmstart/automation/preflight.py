"""The preflight: before `preview` or `up` reach the engine, check in S3, with the deployer's own
AWS credentials, that every model's pods will find their weights.

A model without `import:` streams `source` as it is. Its prefix must hold `config.json` and the
`*.safetensors` shards directly under it (the Run:ai streamer does not list recursively), every
shard `model.safetensors.index.json` names, and shards whose total agrees with `weightsGiB`
within `WEIGHTS_TOLERANCE` (the streamer concurrency, tensor parallel and start-up budget are
derived from it). Otherwise the first `up` would keep GPU nodes waiting out the start-up budget
for weights that never load. A model with `import:` is left to its import Job, which verifies
what it copies.

Every problem of every model is reported at once (`PreflightFailed`, exit 6). S3 is read with
ListBucket, GetObject (only `model.safetensors.index.json`) and HeadBucket; ListBuckets and
STS GetCallerIdentity tell a bucket of another account apart from a denied one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from ..config import NAMESPACE
from ..decisions import naming
from ..plan.platform import config_models, platform_fact, platform_stack
from .request import PreflightProblem

WEIGHTS_TOLERANCE = 0.05
"""How far the safetensors total may be from `weightsGiB`, relative to `weightsGiB` (5 %)."""
GIB = 2**30
CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
WEIGHTS_SUFFIX = ".safetensors"
MAX_LIST_PAGES = 100
"""Bound on ListObjectsV2 / ListBuckets pages (1,000 keys each): far above any model."""
MAX_INDEX_BYTES = 64 * 2**20
"""A larger `model.safetensors.index.json` is not an index."""
MAX_NAMED = 5
"""Names listed in one message before `and N more`."""

# Error codes that reject the credentials themselves: not an access-denied on one resource.
CREDENTIAL_ERRORS = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "TokenRefreshRequired",
                               "InvalidToken", "InvalidClientTokenId", "RequestExpired", "ExpiredTokenException"})
RETRY_FIX = "check the network and the AWS credentials (expired? `aws sso login`) and run again, or pass --skip-preflight"

# Bucket states (bucket_state).
OWNED = "owned"  # exists, owned by the deployer's account
EXISTS = "exists"  # exists, owner not checked (no account id)
MISSING = "missing"  # NoSuchBucket / 404
FOREIGN = "foreign"  # exists in another account
DENIED = "denied"  # 403 on a bucket of the deployer's own account
DENIED_UNKNOWN_OWNER = "denied-unknown-owner"  # 403, and ListBuckets could not tell whose
ERROR = "error"  # anything else (network, throttling, ...)


@dataclass(frozen=True)
class _Model:
    """What the preflight needs of one `models[i]`."""

    key: str
    name: str
    bucket: str
    prefix: str
    weights_gib: float
    startup_budget_seconds: int


def _sync_fix(bucket: str, prefix: str) -> str:
    return (f"upload the model's files: `aws s3 sync <local model folder> s3://{bucket}/{prefix}/` "
            "(config.json, tokenizer files and every *.safetensors shard, directly under the prefix), "
            "or add `import:` to the model so `up` copies them in")


def _error_code(err: Exception) -> tuple[str, int | None]:
    response = getattr(err, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code, status


def _is_missing_bucket(err: Exception) -> bool:
    code, status = _error_code(err)
    return code in ("NoSuchBucket", "404", "NotFound") or (status == 404 and code != "NoSuchKey")


def _is_denied(err: Exception) -> bool:
    code, status = _error_code(err)
    if code in CREDENTIAL_ERRORS:
        return False
    return code in ("AccessDenied", "403", "Forbidden", "AllAccessDisabled") or status == 403


def _describe(err: Exception) -> str:
    code, status = _error_code(err)
    if code or status:
        message = (getattr(err, "response", {}) or {}).get("Error", {}).get("Message") or ""
        return f"{code or status}{': ' + message if message else ''}"
    return f"{type(err).__name__}: {err}"


def _aws_errors() -> tuple[type[Exception], ...]:
    from botocore.exceptions import BotoCoreError, ClientError

    return (ClientError, BotoCoreError)


def _own_bucket_names(s3: Any) -> set[str] | None:
    """The buckets of the deployer's account (ListBuckets), or None when it is denied; any other
    error (rejected credentials, network) is raised."""
    names: set[str] = set()
    kwargs: dict[str, Any] = {}
    for _ in range(MAX_LIST_PAGES):
        try:
            page = s3.list_buckets(**kwargs)
        except _aws_errors() as err:
            if _is_denied(err):
                return None
            raise
        names |= {b["Name"] for b in page.get("Buckets", [])}
        token = page.get("ContinuationToken")
        if not token:
            break
        kwargs = {"ContinuationToken": token}
    return names


def bucket_state(s3: Any, bucket: str, account_id: str | None) -> tuple[str, str]:
    """(state, detail) of a bucket: whether it exists, and whose it is.

    HeadBucket answers 404 for a bucket that exists nowhere and 403 for one the caller may not
    read (its own without s3:ListBucket, or another account's). With the caller's account id,
    `ExpectedBucketOwner` tells the two apart when the bucket is readable; otherwise ListBuckets
    (s3:ListAllMyBuckets) does.
    """
    errors = _aws_errors()
    try:
        s3.head_bucket(Bucket=bucket, **({"ExpectedBucketOwner": account_id} if account_id else {}))
        return (OWNED if account_id else EXISTS), ""
    except errors as err:
        if _is_missing_bucket(err):
            return MISSING, ""
        if not _is_denied(err):
            return ERROR, _describe(err)
    if account_id:
        try:
            s3.head_bucket(Bucket=bucket)
            return FOREIGN, ""  # readable, but not with the deployer's account as its owner
        except errors as err:
            if _is_missing_bucket(err):
                return MISSING, ""
            if not _is_denied(err):
                return ERROR, _describe(err)
    try:
        own = _own_bucket_names(s3)
    except errors as err:
        # A HEAD answers a bare 403 even when the credentials are what S3 rejects; ListBuckets says so.
        return ERROR, _describe(err)
    if own is None:
        return DENIED_UNKNOWN_OWNER, ""
    return (DENIED if bucket in own else FOREIGN), ""


def _bucket_problems(m: _Model, state: str, detail: str, *, create: bool, region: str,
                     platform: str | None = None) -> list[tuple[str, str]]:
    """Problems that the bucket alone decides (then its objects are not looked at). `platform`:
    the platform stack of a model stack, whose bucket it is (a model stack creates none)."""
    b = m.bucket
    if state == MISSING and platform is not None:
        return [(f"bucket {b} does not exist: it is platform stack {platform!r}'s model bucket (its contract names "
                 "it), which that stack creates",
                 f"deploy the platform first (`warmstart up --stack {platform}`), then upload the weights (`aws s3 "
                 f"sync <local model folder> s3://{b}/{m.prefix}/`) or add `import:` to the model")]
    if state == MISSING and create:
        minutes = round(m.startup_budget_seconds / 60)
        return [(f"bucket {b} does not exist yet: the stack would create it empty, and the model's pods "
                 f"would hold their GPU nodes for their whole start-up budget ({m.startup_budget_seconds} s, "
                 f"about {minutes} minutes) waiting for weights nobody uploads",
                 "add `import:` to the model (huggingFace: {repo, revision} or s3: s3://...) so `up` copies "
                 f"the weights in before its pods start, or create and fill the bucket yourself (`aws s3 mb "
                 f"s3://{b} --region {region}`, then `aws s3 sync <local model folder> s3://{b}/{m.prefix}/`) "
                 "and set modelBucket.create: false")]
    if state == MISSING:
        return [(f"bucket {b} does not exist (modelBucket.create: false uses an existing bucket)",
                 f"create it and upload the weights (`aws s3 mb s3://{b} --region {region}`, then "
                 f"`aws s3 sync <local model folder> s3://{b}/{m.prefix}/`), or correct modelBucket.name "
                 "and the model's source, or add `import:` to the model")]
    if state == FOREIGN and create:
        return [(f"bucket {b} exists in another AWS account (bucket names are global), so the stack "
                 "cannot create it",
                 "pick a bucket name of your own in modelBucket.name (and in the model's source, if that is a "
                 "full s3:// URI), or drop modelBucket.name and write the sources as key prefixes (the derived "
                 "name includes the accountId that `up` records), or, if that bucket is meant to hold the "
                 "weights, set modelBucket.create: false")]
    if state == ERROR:
        return [(f"could not check bucket {b} ({detail})", RETRY_FIX)]
    return []


def _list_prefix(s3: Any, bucket: str, prefix: str) -> tuple[dict[str, int], list[str]]:
    """{file name: size} of the objects directly under `prefix/`, and the sub-prefixes' names."""
    files: dict[str, int] = {}
    subdirs: list[str] = []
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": f"{prefix}/", "Delimiter": "/"}
    for _ in range(MAX_LIST_PAGES):
        page = s3.list_objects_v2(**kwargs)
        for obj in page.get("Contents", []):
            name = obj["Key"][len(prefix) + 1:]
            if name:
                files[name] = int(obj.get("Size", 0))
        subdirs += [p["Prefix"][len(prefix) + 1:] for p in page.get("CommonPrefixes", [])]
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            break
        kwargs["ContinuationToken"] = token
    return files, subdirs


def gib(value: float) -> str:
    """GiB for a message: one decimal from 1 GiB up, else three significant digits."""
    return f"{value:.1f}" if value >= 1 else f"{value:.3g}"


def _named(names: Iterable[str]) -> str:
    names = sorted(names)
    shown = ", ".join(names[:MAX_NAMED])
    return shown + (f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else "")


def _index_shards(s3: Any, bucket: str, key: str) -> set[str]:
    """The shard file names `model.safetensors.index.json` maps tensors to."""
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    try:
        raw = body.read(MAX_INDEX_BYTES + 1)
    finally:
        body.close()
    if len(raw) > MAX_INDEX_BYTES:
        raise ValueError(f"larger than {MAX_INDEX_BYTES // 2**20} MiB")
    doc = json.loads(raw)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError("it has no weight_map of tensor names to shard files")
    return set(weight_map.values())


def _object_problems(s3: Any, m: _Model, *, partition: str, owner_unknown: bool, create: bool,
                     region: str, platform: str | None = None) -> list[tuple[str, str]]:
    """What is wrong with the objects under the model's prefix."""
    errors = _aws_errors()
    b, p = m.bucket, m.prefix
    where = f"s3://{b}/{p}/"
    try:
        files, subdirs = _list_prefix(s3, b, p)
    except errors as err:
        if _is_denied(err):
            other = (" (or the bucket belongs to another account: bucket names are global; then pick a "
                     "name of your own)") if owner_unknown else ""
            return [(f"access denied listing {where} ({_describe(err)})",
                     f"give the identity that deploys s3:ListBucket on arn:{partition}:s3:::{b} (for the "
                     f"prefix {p}/), or pass --skip-preflight{other}")]
        if _is_missing_bucket(err):
            return _bucket_problems(m, MISSING, "", create=create, region=region, platform=platform)
        return [(f"could not list {where} ({_describe(err)})", RETRY_FIX)]

    shards = {n: size for n, size in files.items() if n.endswith(WEIGHTS_SUFFIX)}
    found: list[tuple[str, str]] = []
    nested = (f"; it has sub-prefixes ({_named(subdirs)}), and the streamer does not list recursively: "
              "point source at the folder that holds the files, or move them up") if subdirs else ""
    if not files:
        return [(f"{where} holds no objects directly under the prefix: {CONFIG_FILE} and the "
                 f"*{WEIGHTS_SUFFIX} shards are missing{nested}", _sync_fix(b, p))]
    if CONFIG_FILE not in files:
        found.append((f"{CONFIG_FILE} is missing from {where} (vLLM reads it before streaming the weights)",
                      _sync_fix(b, p)))
    if not shards:
        other = sorted(n for n in files if n.endswith((".bin", ".pt", ".pth", ".gguf")))
        kind = (f"; only {_named(other)}: the Run:ai streamer loads safetensors only, so upload the "
                "model's safetensors release (or convert it)") if other else ""
        found.append((f"no *{WEIGHTS_SUFFIX} shards directly under {where}{kind}{nested}", _sync_fix(b, p)))
        return found

    missing_shards: set[str] = set()
    if INDEX_FILE in files:
        try:
            named = _index_shards(s3, b, f"{p}/{INDEX_FILE}")
        except errors as err:
            if _is_denied(err):
                found.append((f"access denied reading {where}{INDEX_FILE} ({_describe(err)})",
                              f"give the identity that deploys s3:GetObject on arn:{partition}:s3:::{b}/{p}/*, "
                              "or pass --skip-preflight"))
            else:
                found.append((f"could not read {where}{INDEX_FILE} ({_describe(err)})", RETRY_FIX))
        except ValueError as err:  # JSONDecodeError included
            found.append((f"{where}{INDEX_FILE} is not a safetensors index ({err})",
                          f"upload the model's own {INDEX_FILE} (`aws s3 cp`), or delete it if the model "
                          "is one file"))
        else:
            missing_shards = named - set(files)
            if missing_shards:
                k = len(missing_shards)
                found.append((f"{INDEX_FILE} names {len(named)} shard{'s' if len(named) > 1 else ''}, {k} of "
                              f"which {'is' if k == 1 else 'are'} not under {where}: {_named(missing_shards)}",
                              _sync_fix(b, p)))
    if not missing_shards:
        measured = sum(shards.values()) / GIB
        if abs(measured - m.weights_gib) > WEIGHTS_TOLERANCE * m.weights_gib:
            other = (f"upload the shards that are missing (`aws s3 sync <local model folder> s3://{b}/{p}/`)"
                     if measured < m.weights_gib else
                     "remove shards that are not this model's (another model's, an older revision's) from the prefix")
            n = len(shards)
            found.append((
                f"the {n} *{WEIGHTS_SUFFIX} shard{'s' if n > 1 else ''} under {where} total {gib(measured)} GiB "
                f"but weightsGiB is {m.weights_gib:g} (off by {abs(measured / m.weights_gib - 1):.0%}; the "
                f"tolerance is {WEIGHTS_TOLERANCE:.0%}). The streamer concurrency, tensor parallel and the "
                "start-up budget are derived from weightsGiB",
                f"set weightsGiB: {gib(measured)} for this model, or {other}"))
    return found


def unchecked_models(stack_plan: Any) -> list[_Model]:
    """The models the preflight checks in S3 (those without `import:`), of an environment stack
    (`warmstart:models[i]`) or a model stack (its one `warmstart:model`, whose relative source
    is in its platform's model bucket), by their resolved bucket and prefix."""
    return [_Model(key, plan.name, plan.bucket, plan.prefix, m.weights_gib, plan.startup_budget_seconds)
            for key, m, plan in config_models(stack_plan) if m.weights_import is None]


def check_models(stack_plan: Any, s3: Any | None, account_id: str | None) -> list[PreflightProblem]:
    """Every problem of every model without `import:` in `stack_plan` (a plan.StackPlan or a
    plan.platform.ModelStackPlan).

    `s3`: a boto3 S3 client (None is allowed when every model imports); `account_id`: the
    deployer's account, or None to skip the ExpectedBucketOwner check.
    """
    region = platform_fact(stack_plan, "region")
    platform = platform_stack(stack_plan)
    # A model stack's bucket is its platform's, which the model stack never creates.
    create = platform is None and stack_plan.aws.buckets.create_model_bucket
    partition = naming.partition(region)
    problems: list[PreflightProblem] = []
    states: dict[str, tuple[str, str]] = {}
    for m in unchecked_models(stack_plan):
        if m.bucket not in states:
            states[m.bucket] = bucket_state(s3, m.bucket, account_id)
        state, detail = states[m.bucket]
        found = _bucket_problems(m, state, detail, create=create, region=region, platform=platform)
        if not found:
            found = _object_problems(s3, m, partition=partition, owner_unknown=state == DENIED_UNKNOWN_OWNER,
                                     create=create, region=region, platform=platform)
        problems += [PreflightProblem(m.key, m.name, what, fix) for what, fix in found]
    return problems


def needs_aws(stack_plan: Any) -> bool:
    """Whether any model is checked in S3 (every model that does not import)."""
    return bool(unchecked_models(stack_plan))


def aws_client(service: str, region: str, *, attempts: int, read_timeout: int) -> Any:
    """A boto3 client for the deployer's credentials in the stack's region (the standard
    AWS_ENDPOINT_URL_<SERVICE> / AWS_ENDPOINT_URL environment variables are honoured, as
    everywhere in boto3)."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session(region_name=region).client(service, config=Config(
        retries={"max_attempts": attempts, "mode": "standard"}, connect_timeout=5, read_timeout=read_timeout))


def credentials_problem(err: Exception) -> tuple[str, str]:
    """(why no AWS client could be made, the fix): a stale AWS_PROFILE is the common case."""
    from botocore.exceptions import ProfileNotFound

    if isinstance(err, ProfileNotFound):
        return (f"the AWS credentials could not be loaded ({type(err).__name__}: {err})",
                "set AWS_PROFILE to a profile of yours (`aws configure list-profiles`) or unset it")
    return (f"no AWS client could be made ({type(err).__name__}: {err})",
            "check the AWS configuration (`aws configure list`) and run again")


def s3_client(region: str) -> Any:
    """A boto3 S3 client for the deployer's credentials in the stack's region."""
    return aws_client("s3", region, attempts=3, read_timeout=30)


def caller_account(region: str) -> str | None:
    """The deployer's AWS account id (STS GetCallerIdentity, which needs no permission), or None.
    Also what `warmstart preview` / `up` record as `accountId` (account.py)."""
    try:
        errors = _aws_errors()
    except ImportError:  # no boto3 (a --skip-preflight run does not require it)
        return None
    try:
        return str(aws_client("sts", region, attempts=2, read_timeout=10).get_caller_identity()["Account"])
    except errors:
        return None


_LOOKUP = object()


def run_preflight(stack_plan: Any, *, s3: Any | None = None, account_id: Any = _LOOKUP) -> list[PreflightProblem]:
    """The preflight of a stack. Unless given, the S3 client and the account id (None: do not
    check the owner) come from the deployer's credentials in the stack's region."""
    if not needs_aws(stack_plan):
        return []
    region = platform_fact(stack_plan, "region")
    if account_id is _LOOKUP:
        account_id = caller_account(region)
    if s3 is None:
        try:
            s3 = s3_client(region)
        except _aws_errors() as err:
            # A stale AWS_PROFILE (ProfileNotFound) fails here, before any request: every model
            # is unchecked, said once per model, not a traceback.
            why, fix = credentials_problem(err)
            return [PreflightProblem(m.key, m.name, f"could not check s3://{m.bucket}/{m.prefix}/: {why}",
                                     f"{fix}, or pass --skip-preflight") for m in unchecked_models(stack_plan)]
    return check_models(stack_plan, s3, account_id)
