"""A `PlatformArgs` (components/platform.py), validated as strictly as a stack file (pure; no
Pulumi).

A ServedModel's `platform` comes from three places: the warmstart stack's own ServingPlatform
(snake_case keys), a platform stack's exported `warmstartPlatform` document read back by a
model stack (camelCase, rekeyed), and a program of someone else's: Python (snake_case keys, enum
members or their values) or another language through the component provider, which maps the
schema's camelCase names onto the Python ones and sends every number as a float. Every fact is
checked here, once: unknown keys are errors (a camelCase key in a Python dict is read as its
snake_case twin, never dropped; both spellings at once are refused), types are strict (no
`"false"` read as true, no string split into a list of characters, no string read as a number),
the cluster mode and the NVMe check are one of their values, and names, ranges and ARNs follow
the rules of what they name. Errors are the stack file's one-liners, keyed
`<key>.<camelCaseKey>` (`ServedModelArgs.platform.clusterMode`).

The values a program wires from other resources (`oidcProviderArn`, `oidcIssuer`,
`compileCacheBucket`, `kubeconfig`, `monitoring.serverAddress`) may be Pulumi Outputs: a plain
string is checked, an Output is taken as it is (its value is not known yet).
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from .. import versions
from ..docstrings import describe_models
from ..config import (DNS_LABEL, DNS_SUBDOMAIN, REFERENCE, STACK_NAME, CompileCacheConfig, LoaderTuning,
                      _from_validation_error, _models_in, _rule)
from ..errors import ConfigError, ConfigErrors

# ASCII classes only: `\d` in a pattern also matches other scripts' digits.
REGION = r"^[a-z]{2}(-[a-z]+)+-[0-9]$"
KUBERNETES_VERSION = r"^1\.[0-9]{2}$"
ACCOUNT_ID = r"^[0-9]{12}$"
# EKS: "The name can contain only alphanumeric characters (case-sensitive), hyphens, and
# underscores. It must start with an alphanumeric character and can't be longer than 100
# characters." https://docs.aws.amazon.com/eks/latest/APIReference/API_CreateCluster.html
CLUSTER_NAME = r"^[0-9A-Za-z][A-Za-z0-9_-]*$"
# IAM role names are `<prefix>-<model>-irsa` (warmstart/decisions/naming.py), of IAM's characters
# (https://docs.aws.amazon.com/IAM/latest/APIReference/API_CreateRole.html).
NAME_PREFIX = r"^[A-Za-z0-9][A-Za-z0-9+=,.@_-]*$"
# The longest name prefix the platform contract carries (a given `namePrefix` is at most 20; one
# derived from the stack's name, `ws-<stack>`, may be longer up to this).
NAME_PREFIX_MAX = 32
# https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html
BUCKET = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"
OIDC_PROVIDER_ARN = re.compile(r"^arn:aws[a-z-]*:iam::[0-9]{12}:oidc-provider/[^\s/]+(/[^\s/]+)*$")
# Kubernetes label keys and values (https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set).
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                       r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")

ARGS_REFERENCE = "components/README.md#platformargs"


def _plain(value: Any) -> Any:
    """Args as the model reads them: enum members become their values, tuples lists, unset
    (None) keys go, and a float that is a whole number (how the component provider and a stack
    output carry every number) an int. Anything else (an Output) is left as it is."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


class _Wired(AfterValidator):
    """The validator of a value a program may wire from another resource (`_wired`): the
    fields it marks keep their Outputs as given (`as_args`)."""


class _FromResources:
    """Marks a fact a program adds from its resources (the network's, the cluster's, the
    buckets', the monitoring's), not one its plan decides (`platform.platform_facts`)."""


FROM_RESOURCES = _FromResources()


def _wired(check: Any = None, *, what: str, example: str) -> Any:
    """A value a program may wire from another resource: a non-empty string (then `check`ed),
    or an Output (taken as it is). A plain number, boolean, list or mapping is refused."""

    def validate(value: Any) -> Any:
        if isinstance(value, str):
            if not value.strip():
                raise _rule(f"is empty: expected {what}", f"give it, e.g. {example}", value)
            return check(value) if check else value
        if isinstance(value, (bool, int, float, list, dict)):
            raise _rule(f"expected {what} (a string, or a Pulumi Output of one)", f"write it as e.g. {example}",
                        value if not isinstance(value, (list, dict)) else None)
        return value

    return _Wired(validate)


def _oidc_provider_arn(value: str) -> str:
    if not OIDC_PROVIDER_ARN.match(value):
        raise _rule("is not an IAM OIDC provider ARN", "write it as "
                    "arn:aws:iam::<account>:oidc-provider/oidc.eks.<region>.amazonaws.com/id/<id>", value)
    return value


def _oidc_issuer(value: str) -> str:
    if value.startswith(("https://", "http://")):
        raise _rule("is the issuer URL: IRSA's trust conditions name the issuer without its scheme",
                    f"write it as {value.split('://', 1)[1]}", value)
    if any(c.isspace() for c in value) or value.startswith("/"):
        raise _rule("is not an OIDC issuer host and path", "write it as oidc.eks.<region>.amazonaws.com/id/<id>",
                    value)
    return value


def _bucket(value: str) -> str:
    if not re.match(BUCKET, value) or ".." in value:
        raise _rule("is not an S3 bucket name (3-63 lowercase letters, digits, dots and hyphens)",
                    "give the bucket's name, not an s3:// URI or ARN", value)
    return value


def _http_url(value: str) -> str:
    if not value.startswith(("https://", "http://")) or any(c.isspace() for c in value):
        raise _rule("is not an http(s) URL", "give the Prometheus query endpoint, e.g. "
                    "https://aps-workspaces.<region>.amazonaws.com/workspaces/<id>", value)
    return value


def _cidr(value: str) -> str:
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError:
        raise _rule("is not an IPv4 CIDR block with its host bits zero", "write it as e.g. 10.0.0.0/16",
                    value) from None
    if net.version != 4 or "/" not in value:
        raise _rule("is not an IPv4 CIDR block (address/prefix length)", "write it as e.g. 10.0.0.0/16", value)
    return value


def _labels(value: dict[str, str]) -> dict[str, str]:
    for k, v in value.items():
        if not LABEL_KEY.match(k) or len(k.rsplit("/", 1)[-1]) > 63 or len(k) > 316:
            raise _rule(f"{k!r} is not a Kubernetes label key", "use a key such as app.kubernetes.io/name", k)
        if not LABEL_VALUE.match(v):
            raise _rule(f"{v!r} (of {k!r}) is not a Kubernetes label value",
                        "use at most 63 letters, digits, '-', '_' and '.', starting and ending alphanumeric", v)
    return value


Cidr = Annotated[str, AfterValidator(_cidr)]
Labels = Annotated[dict[str, str], AfterValidator(_labels)]
Count = Annotated[int, Field(ge=0)]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True,
                              strict=True)  # descriptions: describe_models at the end


class PoolArgsSpec(_Args):
    """A GPU pool (Karpenter or Auto Mode NodePool) models may run on."""

    name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)]
    """The NodePool's name (`karpenter.sh/nodepool`)."""
    instance_types: Annotated[list[Annotated[str, Field(pattern=r"^[a-z0-9-]+\.[a-z0-9-]+$")]], Field(min_length=1)]
    """Its EC2 GPU instance types."""
    max_gpus: Annotated[int, Field(ge=1)]
    """Its GPU limit (the NodePool's `limits`)."""
    capacity_types: Annotated[list[Literal["on-demand", "spot", "reserved"]], Field(min_length=1)] = ["on-demand"]
    """The NodePool's `karpenter.sh/capacity-type` values."""
    inline_gpus: Count = 0
    """GPUs the platform's own models and warm spares take at their ceiling."""
    staged_bytes: Count = 0
    """Bytes of weights the platform's own models stage on each node's NVMe."""
    compile_cache_models: Count = 0
    """How many of the platform's own models keep a compile cache on the nodes."""


class ScraperPodsSpec(_Args):
    """A Prometheus of your own in the cluster, by namespace and pod labels."""

    namespace: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]
    pod_labels: Annotated[Labels, Field(min_length=1)]


class MonitoringSpec(_Args):
    """The metrics a model's autoscaling reads, and who scrapes the pods."""

    server_address: Annotated[Any, _wired(_http_url, what="the Prometheus query endpoint",
                                          example="https://prometheus.example/api/v1")]
    region: Annotated[str, Field(pattern=REGION)] | None = None
    managed_scraper: bool = False
    scraper_pods: list[ScraperPodsSpec] = []
    keda_namespace: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)] = "keda"


class TolerationSpec(_Args):
    """A Kubernetes toleration (core/v1 Toleration's fields, without `tolerationSeconds`)."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class NonGpuPlacementSpec(_Args):
    """Where the platform's non-GPU pods (routers, import Jobs) are scheduled."""

    node_selector: Labels = {}
    tolerations: list[TolerationSpec] = []


class PlatformArgsSpec(_Args):
    """Every fact of a `PlatformArgs` (components/platform.py has their descriptions)."""

    contract_version: int | None = None
    """A platform stack's exported document's version, when the document is passed as it is."""
    warmstart_version: str | None = None
    """The warmstart version that exported that document (its major must be this warmstart's)."""
    stack: Annotated[str, Field(pattern=STACK_NAME)]
    region: Annotated[str, Field(pattern=REGION)]
    cluster_name: Annotated[str, Field(pattern=CLUSTER_NAME, max_length=100)]
    cluster_mode: Literal["auto", "karpenter"]
    kubernetes_version: Annotated[str, Field(pattern=KUBERNETES_VERSION)]
    namespace: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]
    name_prefix: Annotated[str, Field(pattern=NAME_PREFIX, max_length=NAME_PREFIX_MAX)]
    oidc_provider_arn: Annotated[Any, _wired(_oidc_provider_arn, what="an IAM OIDC provider ARN",
                                             example="arn:aws:iam::123456789012:oidc-provider/"
                                                     "oidc.eks.us-east-1.amazonaws.com/id/EXAMPLE"), FROM_RESOURCES]
    oidc_issuer: Annotated[Any, _wired(_oidc_issuer, what="the OIDC issuer without https://",
                                       example="oidc.eks.us-east-1.amazonaws.com/id/EXAMPLE"), FROM_RESOURCES]
    vpc_cidrs: Annotated[list[Cidr], Field(min_length=1), FROM_RESOURCES]
    service_cidr: Annotated[Cidr, FROM_RESOURCES]
    model_bucket: Annotated[str, AfterValidator(_bucket)]
    pools: list[PoolArgsSpec]
    kubeconfig: Annotated[Any, _wired(what="a kubeconfig", example="the cluster's kubeconfig (a secret)"),
                          FROM_RESOURCES] = None
    compile_cache_bucket: Annotated[Any, _wired(_bucket, what="an S3 bucket name", example="my-compile-cache"),
                                    FROM_RESOURCES] = None
    loader: LoaderTuning = LoaderTuning()
    compile_cache: CompileCacheConfig = CompileCacheConfig()
    nvme_check: Literal["warn", "fail"] = "warn"
    models: list[Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]] = []
    node_cache: bool = False
    image_cache_account: Annotated[str, Field(pattern=ACCOUNT_ID)] | None = None
    monitoring: Annotated[MonitoringSpec | None, FROM_RESOURCES] = None
    pod_scripts: bool = False
    non_gpu_placement: NonGpuPlacementSpec | None = None

    @field_validator("pools")
    @classmethod
    def _one_pool_per_name(cls, pools: list[PoolArgsSpec]) -> list[PoolArgsSpec]:
        names = [p.name for p in pools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise _rule(f"names pool(s) {', '.join(twice)} more than once", "give each pool once", twice)
        return pools


def _both_spellings(values: Any, model: type[BaseModel], path: str) -> list[ConfigError]:
    """A key given both as its snake_case name and its camelCase alias, in this mapping or a
    nested one: pydantic would keep one and call the other unknown."""
    if isinstance(values, list):
        return [e for i, v in enumerate(values) for e in _both_spellings(v, model, f"{path}[{i}]")]
    if not isinstance(values, Mapping):
        return []
    out: list[ConfigError] = []
    for name, info in model.model_fields.items():
        alias = info.alias or name
        if alias != name and name in values and alias in values:
            out.append(ConfigError(f"{path}.{alias}", f"is given twice, as `{name}` and as `{alias}`",
                                   f"keep one of them (`{name}` in Python)"))
        for sub in _models_in(info.annotation):
            out += _both_spellings(values.get(name, values.get(alias)), sub, f"{path}.{alias}")
    return out


def _python_names(fix: str) -> str:
    """A fix that names keys in the schema's camelCase (`clusterName`) also names their Python
    spelling, as a Python caller writes them."""
    def both(m: re.Match[str]) -> str:
        snake = re.sub(r"(?<!^)([A-Z])", lambda c: "_" + c.group(1).lower(), m.group(1))
        return m.group(0) if snake == m.group(1) else f"`{m.group(1)}` (`{snake}` in Python)"
    return re.sub(r"`([a-z][A-Za-z0-9]*)`", both, fix)


def check(args: Any, key: str, version: int) -> PlatformArgsSpec:
    """`args` (a PlatformArgs: snake_case or camelCase keys, enum members or values, whole
    numbers as floats) validated, or ConfigErrors keyed `<key>.<camelCaseKey>`. `version` is the
    contract version a platform document passed as it is must have."""
    if not isinstance(args, Mapping):
        raise ConfigError(key, f"expected a PlatformArgs mapping, got {type(args).__name__}",
                          "give its keys as plain values (a ServingPlatform's `args`, or the document a platform "
                          "stack exports, read with StackReference.get_output_details)")
    values = _plain(dict(args))
    both = _both_spellings(values, PlatformArgsSpec, key)
    if both:
        raise ConfigErrors(both)
    try:
        # strict=True reaches the nested config models too (the loader's, the compile cache's).
        spec = PlatformArgsSpec.model_validate(values, strict=True)
    except ValidationError as err:
        # The keys are PlatformArgs', described in the components' reference, not a stack file's.
        raise ConfigErrors([ConfigError(e.key, e.rule, _python_names(e.fix.replace(REFERENCE, ARGS_REFERENCE)),
                                        e.value)
                            for e in _from_validation_error(err, f"{key}.", PlatformArgsSpec).errors]) from None
    if spec.contract_version is not None and spec.contract_version != version:
        raise ConfigError(f"{key}.contractVersion", f"is a version-{spec.contract_version} platform document; "
                          f"this warmstart reads version {version}",
                          "deploy the platform stack with this warmstart version", spec.contract_version)
    if spec.contract_version is not None:
        problem = versions.platform_version_problem(spec.warmstart_version)
        if problem:
            raise ConfigError(f"{key}.warmstartVersion", f"the platform document {problem}",
                              f"up the platform stack with warmstart {versions.major(versions.WARMSTART_VERSION)}.x "
                              "first (docs/upgrading.md)", spec.warmstart_version)
    return spec


def marked(model: type[BaseModel], mark: Any) -> tuple[str, ...]:
    """The fields of `model` whose declaration carries `mark` (`FROM_RESOURCES`, or a `_Wired`
    validator when `mark` is that class)."""
    return tuple(name for name, info in model.model_fields.items()
                 if any(m is mark or (isinstance(mark, type) and isinstance(m, mark)) for m in info.metadata))


def wired_fields(model: type[BaseModel]) -> tuple[str, ...]:
    """The fields of `model` a program may wire from other resources (Outputs kept as given)."""
    return marked(model, _Wired)


def resource_facts() -> tuple[str, ...]:
    """The PlatformArgs facts a program adds from its resources, beside the plan's
    (`platform.platform_facts`)."""
    return marked(PlatformArgsSpec, FROM_RESOURCES)


def _dumped(spec: BaseModel, **how: Any) -> dict[str, Any]:
    """`spec` dumped, with its wired values (Outputs, which a dump would copy) as given, nested
    models' too."""
    out = spec.model_dump(**how)
    for name in spec.model_fields_set if how.get("exclude_unset") else type(spec).model_fields:
        if name not in out:
            continue
        value = getattr(spec, name)
        if name in wired_fields(type(spec)):
            out[name] = value
        elif isinstance(value, BaseModel) and wired_fields(type(value)):
            out[name] = _dumped(value, **how)
    return out


def as_args(spec: PlatformArgsSpec) -> dict[str, Any]:
    """The validated PlatformArgs as a dict of snake_case keys (Python's spelling), the keys set
    and nothing else; wired values (Outputs) as given."""
    return _dumped(spec, exclude_unset=True, exclude={"contract_version", "warmstart_version"})


describe_models(__name__)
