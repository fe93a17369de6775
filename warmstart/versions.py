"""Every container image and Helm chart version warmstart deploys, pinned in one place, and
warmstart's own version.

Images carry a digest where the upstream digest is known; a tag-only image is flagged in
`warmstart render`'s table so a stack can pin its own digest.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

# warmstart's own version (https://semver.org/): the package's (pyproject.toml reads it from here,
# `[tool.setuptools.dynamic]`), the component package schema's (components/__main__.py) and the
# one a platform stack's exported contract carries (warmstart/plan/platform.py), so a model stack
# refuses a platform of another major version. Each version has its entry in CHANGELOG.md; a
# test holds the component schema to the entry's recorded fingerprint (components/schema.lock).
WARMSTART_VERSION = "1.0.0"


def major(version: str) -> int:
    """The major version of a semantic version string (`1.4.2` -> 1); ValueError otherwise."""
    head = version.split(".", 1)[0]
    if not head.isascii() or not head.isdigit():
        raise ValueError(f"{version!r} is not a semantic version (MAJOR.MINOR.PATCH)")
    return int(head)


def platform_version_problem(exported: object) -> str | None:
    """Why this warmstart cannot read a platform contract exported by warmstart `exported` (the
    document's `warmstartVersion`; None: exported by 0.x, which wrote none): another major
    version, whose contract may mean something else (semver: a major version is the one that may
    break). None: the same major version."""
    own = major(WARMSTART_VERSION)
    if exported is None:
        return (f"was exported by warmstart 0.x (its document carries no warmstartVersion), and this is "
                f"warmstart {WARMSTART_VERSION}")
    try:
        theirs = major(str(exported))
    except ValueError:
        return f"carries warmstartVersion {exported!r}, which is not a semantic version"
    if theirs != own:
        return (f"was exported by warmstart {exported} (major version {theirs}), and this is warmstart "
                f"{WARMSTART_VERSION} (major version {own})")
    return None

# vLLM >= 0.11.1 is needed for `distributed` in --model-loader-extra-config (added by
# https://github.com/vllm-project/vllm/pull/27230). Stacks should pin their image by digest.
VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"

# SMG (Shepherd Model Gateway) 1.13.0, the prefix-aware router in front of a model's replicas
# (warmstart/decisions/routing.py). Source: https://github.com/smg-project/smg (formerly
# lightseekorg/smg); its release workflow (.github/workflows/release-docker.yml) pushes
# docker/Dockerfile to Docker Hub as `lightseekorg/smg:<version of bindings/python/pyproject.toml>`,
# the same build as PyPI `smg==1.13.0` (the wheel the routing tests run). Tag only: the published
# digest of 1.13.0 is not known here (flagged by `warmstart render`); ModelRouterArgs.image takes
# `...@sha256:<digest>`.
SMG_VERSION = "1.13.0"
SMG_IMAGE = f"docker.io/lightseekorg/smg:{SMG_VERSION}"

# Karpenter 1.14.1, published chart, installed as in
# https://karpenter.sh/v1.14/getting-started/getting-started-with-karpenter/
KARPENTER_CHART = "oci://public.ecr.aws/karpenter/karpenter"
KARPENTER_VERSION = "1.14.1"
KARPENTER_CONTROLLER_IMAGE = (
    "public.ecr.aws/karpenter/controller:1.14.1"
    "@sha256:723130949e4cab989461ff07d1be4cd781d63515432494641b33c235f300ae23"
)

# Kubernetes version a stack targets when it does not say; also the schema version the
# rendered objects are validated against. The newest EKS version in standard support on
# 2026-12-01 (EKS_RELEASE_CALENDAR below) that every pin here supports: Karpenter 1.14 supports
# Kubernetes up to 1.36 (compatibility matrix,
# https://github.com/aws/karpenter-provider-aws/blob/main/website/content/en/v1.14/upgrading/compatibility.md),
# pulumi-eks 4.4.0 passes `version` through to aws.eks.Cluster, where it is updatable in place
# (no replacement), and kubernetes-validate 1.37.0 ships the 1.36 schemas. Bump it together
# with the calendar; the `eks-version-standard-support` policy warns once a stack's version
# is billed as extended support.
DEFAULT_KUBERNETES_VERSION = "1.36"

# Karpenter's CRDs as their own chart, so `helm upgrade` updates them (Helm installs a
# chart's crds/ folder only on first install; see "CRD Upgrades" in
# https://karpenter.sh/v1.14/upgrading/upgrade-guide/). Same version as the controller.
KARPENTER_CRD_CHART = "oci://public.ecr.aws/karpenter/karpenter-crd"

# EKS-optimized AL2023 AMI release for Karpenter's EC2NodeClass (`amiSelectorTerms.alias`).
# Pinned: `@latest` makes every node drift, i.e. be replaced, on each weekly AMI release
# (https://karpenter.sh/v1.14/concepts/nodeclasses/#specamiselectorterms). GPU instance types get
# the release's NVIDIA variant. Bump deliberately.
KARPENTER_AMI_ALIAS = "al2023@v20260903"

# NVIDIA device plugin (karpenter mode only: Auto Mode has the plugin built in,
# https://docs.aws.amazon.com/eks/latest/userguide/auto-accelerated.html). Official chart
# repository and a pinned chart version (release-0.20 line).
NVIDIA_DEVICE_PLUGIN_REPO = "https://nvidia.github.io/k8s-device-plugin"
NVIDIA_DEVICE_PLUGIN_CHART = "nvidia-device-plugin"
NVIDIA_DEVICE_PLUGIN_VERSION = "0.20.1"

# KEDA, the autoscaler of `models[].autoscaling`, from its official chart repository. Chart
# 2.20.2 installs KEDA 2.20.2 (kedacore/charts tag v2.20.2 = cbb9bb8c, keda/Chart.yaml:
# `version: 2.20.2`, `appVersion: 2.20.2`); the chart renders its CRDs as templates, so they
# are upgraded with the release. The vendored CRDs in tests/schemas/keda/ are that tag's.
KEDA_CHART_REPO = "https://kedacore.github.io/charts"
KEDA_CHART = "keda"
KEDA_CHART_VERSION = "2.20.2"


# --------------------------------------------------------------------------------------
# EKS Kubernetes release calendar: the dates (UTC) each version leaves standard support (from
# then on EKS bills it as extended support, per cluster hour) and extended support (EKS then
# upgrades the control plane on its own). Source: "Understand the Kubernetes version lifecycle
# on EKS", Amazon EKS release calendar,
# https://docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html#kubernetes-release-calendar
# (rows 1.29-1.34 as in awsdocs/amazon-eks-user-guide latest/ug/versioning/kubernetes-versions.adoc;
# 1.35 and 1.36 as copies of that calendar published after their EKS release give them, e.g.
# https://endoflife.date/amazon-eks: check them against the page when bumping). Standard
# support is 14 months from the EKS release, extended support 12 more.


@dataclass(frozen=True)
class EksVersion:
    """One row of the EKS release calendar."""

    version: str
    eks_release: date
    end_of_standard_support: date
    end_of_extended_support: date


EKS_RELEASE_CALENDAR_URL = "https://docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html#kubernetes-release-calendar"
EKS_RELEASE_CALENDAR: tuple[EksVersion, ...] = (
    EksVersion("1.36", date(2026, 6, 2), date(2027, 8, 2), date(2028, 8, 2)),
    EksVersion("1.35", date(2026, 1, 27), date(2027, 3, 27), date(2028, 3, 27)),
    EksVersion("1.34", date(2025, 10, 2), date(2026, 12, 2), date(2027, 12, 2)),
    EksVersion("1.33", date(2025, 5, 29), date(2026, 7, 29), date(2027, 7, 29)),
    EksVersion("1.32", date(2025, 1, 23), date(2026, 3, 23), date(2027, 3, 23)),
    EksVersion("1.31", date(2024, 9, 26), date(2025, 11, 26), date(2026, 11, 26)),
    EksVersion("1.30", date(2024, 5, 23), date(2025, 7, 23), date(2026, 7, 23)),
    EksVersion("1.29", date(2024, 1, 23), date(2025, 3, 23), date(2026, 3, 23)),
)

STANDARD, EXTENDED, END_OF_SUPPORT, UNKNOWN = "standard", "extended", "end-of-support", "unknown"


def _minor(version: str) -> tuple[int, int] | None:
    parts = version.split(".")
    if len(parts) < 2 or not all(p.isascii() and p.isdigit() for p in parts[:2]):
        return None
    return int(parts[0]), int(parts[1])


def eks_support(version: str, on: date) -> tuple[str, EksVersion | None]:
    """Which EKS support period `version` (`1.36`, or `1.36.2`) is in on day `on`: `standard`,
    `extended` (billed extra), `end-of-support` (EKS upgrades it), or `unknown` (not in the
    calendar and newer than its oldest row), with the calendar row when there is one. A support
    period ends at the start of its end date (UTC): billing for extended support starts that day."""
    minor = _minor(version)
    if minor is None:
        return UNKNOWN, None
    for row in EKS_RELEASE_CALENDAR:
        if _minor(row.version) == minor:
            if on < row.end_of_standard_support:
                return STANDARD, row
            return (EXTENDED if on < row.end_of_extended_support else END_OF_SUPPORT), row
    oldest = min(EKS_RELEASE_CALENDAR, key=lambda r: _minor(r.version) or (0, 0))
    if minor < (_minor(oldest.version) or (0, 0)):
        return END_OF_SUPPORT, None
    return UNKNOWN, None


# --------------------------------------------------------------------------------------
# Node-local model cache (warmstart/manifests/node_cache.py).

# s5cmd, the S3 -> NVMe copier of the weights-staging DaemonSet: the official image of
# https://github.com/peak/s5cmd (release v2.3.0, the newest release), used only to copy its
# static binary into the pod (the model image runs it). No upstream digest recorded here yet:
# tag-only, flagged in the render table; pin `@sha256:` when mirroring it.
S5CMD_IMAGE = "peakcom/s5cmd:v2.3.0"
S5CMD_BINARY_IN_IMAGE = "/s5cmd"

# Node Feature Discovery: only nfd-master runs (it turns the staging pods' NodeFeature objects
# into node labels). OCI chart as published by the project
# (https://kubernetes-sigs.github.io/node-feature-discovery/v0.19/deployment/helm.html).
NFD_CHART = "oci://registry.k8s.io/nfd/charts/node-feature-discovery"
NFD_VERSION = "0.19.0"

# Warm-spare placeholder pods (they only hold a node's GPUs). Kubernetes' own pause image.
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
