"""The EKS cluster's Kubernetes version is in EKS standard support on the day the check runs.

Past the end of standard support EKS bills the cluster as extended support, per cluster hour,
and past the end of extended support it upgrades the control plane on its own ("Understand the
Kubernetes version lifecycle on EKS",
https://docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html). Nothing breaks on
that day, so the check is advisory (`Check.enforcement`): it warns in every preview and update,
and never blocks one. The dates are the calendar in `warmstart/versions.py`; a version newer than
the calendar knows is not reported.
"""

from __future__ import annotations

from datetime import date, datetime, timezone
from typing import Sequence

from .. import versions
from .records import Resource, Violation, is_unknown

POLICY = "eks-version-standard-support"
# The pulumi-eks component (its `version` input) and the aws.eks.Cluster it creates: a real
# preview shows both, the mocks only the first; one cluster is reported once.
CLUSTER_TYPES = ("eks:index:Cluster", "aws:eks/cluster:Cluster")


def today_utc() -> date:
    """The day in UTC, the time zone of the EKS calendar's dates."""
    return datetime.now(timezone.utc).date()


def check_eks_version(resources: Sequence[Resource], today: date | None = None) -> list[Violation]:
    """A warning per EKS cluster whose Kubernetes version is past standard support on `today`
    (default: the current UTC day)."""
    on = today or today_utc()
    out: list[Violation] = []
    seen: set[tuple[str, str]] = set()
    for r in resources:
        if r.typ not in CLUSTER_TYPES:
            continue
        version = r.props.get("version")
        if not isinstance(version, str) or is_unknown(version):
            continue  # unset (EKS picks its default, always in standard support) or not known yet
        name = r.props.get("name")
        ident = (name if isinstance(name, str) else r.key, version)
        if ident in seen:
            continue
        seen.add(ident)
        status, row = versions.eks_support(version, on)
        newest = versions.DEFAULT_KUBERNETES_VERSION
        fix = (f"fix: upgrade to a version in standard support (warmstart's default is {newest}; set "
               "warmstart:kubernetesVersion, one minor version per `up`: EKS upgrades one at a time; "
               f"calendar: {versions.EKS_RELEASE_CALENDAR_URL})")
        if status == versions.EXTENDED and row:
            out.append(Violation(POLICY, r, f"{r.label()}: Kubernetes {version} left EKS standard support on "
                                 f"{row.end_of_standard_support.isoformat()} and is billed as extended support "
                                 f"until {row.end_of_extended_support.isoformat()}; {fix}"))
        elif status == versions.END_OF_SUPPORT:
            ended = f" on {row.end_of_extended_support.isoformat()}" if row else ""
            out.append(Violation(POLICY, r, f"{r.label()}: Kubernetes {version} is past the end of EKS extended "
                                 f"support{ended}: EKS upgrades the control plane on its own; {fix}"))
    return out
