"""Physical names of AWS resources: the one place they are derived (pure, no Pulumi).

Every name here is a function of stack config only, so a render is byte-identical and the
name can be checked against AWS's limits before anything is deployed.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re

# S3 general purpose bucket naming rules (S3 User Guide, "General purpose bucket naming rules").
BUCKET_NAME_MIN = 3
BUCKET_NAME_MAX = 63
_BUCKET_CHARS = re.compile(r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$")
_BUCKET_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")

# IAM quotas (IAM User Guide, "IAM object quotas"): role names up to 64 characters of
# ASCII letters and digits and _+=,.@- (`\w` would admit any Unicode letter or digit).
ROLE_NAME_MAX = 64
_ROLE_CHARS = re.compile(r"^[A-Za-z0-9_+=,.@-]+$")

# EKS cluster names: up to 100 characters, starting with a letter or digit.
CLUSTER_NAME_MAX = 100

HASH_CHARS = 8


def short_hash(*parts: str) -> str:
    """A short, stable hex digest of `parts` (never random: renders must not diff)."""
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:HASH_CHARS]


def cluster_name(name_prefix: str) -> str:
    """The EKS cluster's name. Shared by the cluster layer and the network layer, which tags
    the private subnets `karpenter.sh/discovery: <cluster name>`."""
    return name_prefix


def bucket_name_problems(name: str) -> list[str]:
    """Every S3 bucket naming rule `name` breaks (empty when the name is valid).

    Dots are refused even though S3 allows them: a dotted name breaks TLS certificate
    matching for virtual-hosted-style requests, which is what the weight streamer sends.
    """
    problems = []
    if not BUCKET_NAME_MIN <= len(name) <= BUCKET_NAME_MAX:
        problems.append(f"must be {BUCKET_NAME_MIN}-{BUCKET_NAME_MAX} characters long (is {len(name)})")
    if not _BUCKET_CHARS.match(name):
        problems.append("must use only lowercase letters, digits and hyphens, and start and end "
                        "with a letter or digit")
    if "." in name:
        problems.append("must not contain dots (they break TLS for virtual-hosted-style requests)")
    if ".." in name:
        problems.append("must not contain two adjacent periods")
    try:
        ipaddress.IPv4Address(name)
        problems.append("must not be formatted as an IP address")
    except ValueError:
        pass
    for p in _BUCKET_RESERVED_PREFIXES:
        if name.startswith(p):
            problems.append(f"must not start with the reserved prefix {p!r}")
    for s in _BUCKET_RESERVED_SUFFIXES:
        if name.endswith(s):
            problems.append(f"must not end with the reserved suffix {s!r}")
    return problems


def bucket_name(name_prefix: str, purpose: str, stack: str, region: str, account_id: str | None = None) -> str:
    """A derived bucket name: `<prefix>-<purpose>-<hash8>`.

    Bucket names are global across all AWS accounts. The hash covers the stack, region and
    prefix (and the account id, when the stack config names it), so two stacks, two regions
    or two accounts that set `accountId` never derive the same name; the hash is of config
    only, so it is known offline and never changes between renders. The name is at most
    20 + 1 + len(purpose) + 1 + 8 characters.
    """
    digest = short_hash("bucket", name_prefix, purpose, stack, region, account_id or "")
    return f"{name_prefix}-{purpose}-{digest}"


def role_name(name_prefix: str, model: str) -> str:
    """The IAM role one model's ServiceAccount assumes: `<prefix>-<model>-irsa`, or, when that
    passes IAM's 64-character limit, a truncated form ending in a hash of the full name so two
    long model names never collide."""
    full = f"{name_prefix}-{model}-irsa"
    if len(full) <= ROLE_NAME_MAX:
        return full
    digest = short_hash("role", name_prefix, model)
    keep = ROLE_NAME_MAX - len("-irsa") - 1 - HASH_CHARS
    return f"{full[:keep].rstrip('-')}-{digest}-irsa"


IMPORT_ROLE_SUFFIX = "import"


def import_role_name(name_prefix: str, model: str) -> str:
    """The IAM role of one model's weights-import Job: `<prefix>-<model>-import`, or, past IAM's
    64-character limit, a truncated form ending in a hash of the full name (as `role_name`)."""
    suffix = f"-{IMPORT_ROLE_SUFFIX}"
    full = f"{name_prefix}-{model}{suffix}"
    if len(full) <= ROLE_NAME_MAX:
        return full
    digest = short_hash("role", name_prefix, model, IMPORT_ROLE_SUFFIX)
    keep = ROLE_NAME_MAX - len(suffix) - 1 - HASH_CHARS
    return f"{full[:keep].rstrip('-')}-{digest}{suffix}"


def role_name_valid(name: str) -> bool:
    return 1 <= len(name) <= ROLE_NAME_MAX and bool(_ROLE_CHARS.match(name))


def partition(region: str) -> str:
    """The AWS partition of a region, for ARNs built before anything is deployed."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def s3_service_name(region: str) -> str:
    """The S3 endpoint service of a region
    (https://docs.aws.amazon.com/vpc/latest/privatelink/vpc-endpoints-s3.html)."""
    return f"com.amazonaws.{region}.s3"


# The pod-side scripts' ConfigMaps (warmstart/manifests/pod_scripts.py). A platform ships each
# script once per namespace as `warmstart-<script>`; a model whose platform did not (a VllmModel,
# ModelNodeCache or ModelStandby used alone) ships its own copy, `<model>-<script>`. The standby
# actuator's own copy is `<model>-standby-script`, the name it was first deployed with: a
# ConfigMap renamed is a ConfigMap replaced, and the pods that mount it rolled.
SHARED_SCRIPT_PREFIX = "warmstart-"
_OWN_SCRIPT_SUFFIXES = {"warmstart-standby": "-standby-script"}


def script_config_map(shared: str, model: str, own: bool) -> str:
    """The ConfigMap a model's pods mount the pod-side script of the shared ConfigMap `shared`
    (`warmstart-<script>`) from: `shared` itself, or with `own` the model's own copy."""
    if not shared.startswith(SHARED_SCRIPT_PREFIX):
        raise ValueError(f"{shared!r} is not a shared pod-script ConfigMap ({SHARED_SCRIPT_PREFIX}<script>)")
    if not own:
        return shared
    return model + _OWN_SCRIPT_SUFFIXES.get(shared, "-" + shared.removeprefix(SHARED_SCRIPT_PREFIX))


# Kubernetes object names warmstart derives from a model's name (its router, import Job, staging
# pods, load balancer, KEDA authentication, scripts) and from a pool's (its warm spares). Two
# models whose names and derived names meet would own one object, or one IAM role
# (`<prefix>-<name>-irsa`), and the `up` fails with a conflict or EntityAlreadyExists.
# tests/identity/test_naming_iam.py checks this list against every object name of every render,
# tests/pod_scripts/test_pod_scripts.py that it holds every model's own copy of a pod script.
MODEL_NAME_SUFFIXES = ("-router", "-router-control-plane", "-vllm", "-internal", "-import", "-hf-token",
                       "-keda-aws", "-weights", "-first-token", "-nvme-check", "-compile-cache", "-weights-import",
                       "-weights-select", "-weights-stage", "-bench-loader", "-metrics-proxy", "-standby-script")
# Suffixes followed by a pool name or a digest.
MODEL_NAME_FAMILIES = ("-import-", "-image-", "-weights-")
POOL_NAME_SUFFIXES = ("-warm-spare",)


def derived_from(name: str, owner: str) -> str | None:
    """How `name` is one of the names warmstart derives from model `owner` (the suffix), or None."""
    if not name.startswith(f"{owner}-"):
        return None
    rest = name[len(owner):]
    if rest in MODEL_NAME_SUFFIXES:
        return rest
    return next((f"{f}..." for f in MODEL_NAME_FAMILIES if rest.startswith(f) and len(rest) > len(f)), None)


def model_name_clashes(models: "list[str] | tuple[str, ...]", pools: "list[str] | tuple[str, ...]" = ()
                       ) -> list[tuple[int, str]]:
    """(index, why) for each model whose name is a name warmstart derives for another model or a
    pool (`foo-weights` beside a staged `foo`, `foo-router` beside a routed `foo`)."""
    out = []
    for i, name in enumerate(models):
        for other in models:
            if other != name and (suffix := derived_from(name, other)) is not None:
                out.append((i, f"is also the name of model {other!r}'s `{suffix}` objects (and its IAM role "
                               f"`...-{name}-irsa`)"))
                break
        else:
            for pool in pools:
                if any(name == f"{pool}{s}" for s in POOL_NAME_SUFFIXES):
                    out.append((i, f"is also the name of pool {pool!r}'s warm-spare placeholders"))
                    break
    return out
