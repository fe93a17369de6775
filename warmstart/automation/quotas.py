"""The quota preflight: before `preview` or `up` reach the engine, read the account's EC2 vCPU
quotas for the GPU families the pools launch, with the deployer's own credentials, and compare
them with what the pools need at their limits.

On a fresh account the quota for P and G instances is usually too small for one p5.48xlarge
(192 vCPUs) or a few g6e nodes; Karpenter or Auto Mode then cannot launch a node, the vLLM pods
stay Pending and the first `up` waits out the Deployments' timeout. So:

- need: every node each pool launches at its limits (every model at its maxReplicas plus one
  surging pod, the warm spares; `gpu_pools.launch_nodes`), in vCPUs, per quota: the On-Demand
  quota of the family class where the pool may run on-demand or reserved (reservations count
  against it), the Spot quota where it may run spot (decisions/capacity.py);
- each quota is read with Service Quotas `GetServiceQuota` (the account's applied value; the
  AWS default where none is applied). A quota below the need stops the command with exit 4
  (`EXIT_QUOTA`), naming the quota, its value, the need and the exact request that raises it;
- no permission to read quotas (or no answer from the API) is a warning, not a failure: the
  engine still runs, and the pods wait for capacity as they would have.

A reservation id left at the shipped placeholder is named too (a warning: nodes then launch
on-demand, as the fallback allows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import config
from ..config import NAMESPACE
from ..decisions import capacity

SERVICE_CODE = "ec2"
# Error codes that say the caller may not read quotas (Service Quotas, or an SCP in front of it).
DENIED = frozenset({"AccessDeniedException", "AccessDenied", "UnauthorizedOperation", "NoAvailableOrganizationException"})


@dataclass(frozen=True)
class QuotaShort:
    """One quota below what the pools need."""

    code: str
    name: str
    value: float
    need: int
    pools: tuple[str, ...]
    region: str

    @property
    def request(self) -> str:
        return capacity.increase_command(self.code, self.need, self.region)

    def __str__(self) -> str:
        return (f"EC2 quota \"{self.name}\" ({self.code}) in {self.region} is {self.value:g} vCPUs, but the GPU pools "
                f"need {self.need} at their limits ({', '.join(self.pools)}): Karpenter / Auto Mode could not launch "
                f"the nodes and the pods would stay Pending; fix: `{self.request}` (then wait for the increase), or "
                "lower the pools' maxReplicas, warmNodes or instance sizes")


@dataclass
class QuotaReport:
    """What the quota preflight found."""

    checked: list[tuple[capacity.QuotaNeed, float]] = field(default_factory=list)
    """Each quota read and its value."""
    short: list[QuotaShort] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def passed_line(self) -> str:
        parts = [f"{n.name} ({n.code}) {v:g} vCPUs >= {n.vcpus} needed" for n, v in self.checked]
        return "warmstart: quota preflight passed: " + ("; ".join(parts) if parts else "no quota was read")


class QuotaShortFailed(Exception):
    def __init__(self, operation: str, stack: str, short: list[QuotaShort]) -> None:
        self.short = short
        n = len(short)
        lines = [f"warmstart: cannot run `{operation}` on stack '{stack}': {n} EC2 vCPU quota{'s are' if n > 1 else ' is'} "
                 "below what the GPU pools need (no engine call was made; `--skip-preflight` skips this check):"]
        lines += [f"  - {s}" for s in short]
        super().__init__("\n".join(lines))


def stack_needs(stack_plan: Any) -> list[capacity.QuotaNeed]:
    """The vCPUs each quota must allow for an environment stack's pools (none for a model stack,
    whose platform owns the pools)."""
    cluster = getattr(stack_plan, "cluster", None)
    if cluster is None:
        return []
    return capacity.quota_needs((p.name, p.capacity.types, p.launch_nodes) for p in cluster.pools)


def placeholder_warnings(stack_plan: Any) -> list[str]:
    """One line per reservation id still at the shipped placeholder."""
    cluster = getattr(stack_plan, "cluster", None)
    out = []
    for i, pool in enumerate(cluster.pools if cluster else ()):
        for j, (rid, _, _) in enumerate(pool.capacity.reservation_terms):
            if rid == capacity.PLACEHOLDER_RESERVATION_ID:
                fallback = [t for t in pool.capacity.types if t != "reserved"]
                then = (f"its nodes launch as {', then '.join(config.CAPACITY_TYPE_LABEL_VALUE[t] for t in fallback)} instead" if fallback else
                        "no node can launch at all (reserved is its only capacity type)")
                out.append(f"{NAMESPACE}:gpuPools[{i}].capacity.reservations[{j}].id is the placeholder {rid}, not a "
                           f"reservation of yours: pool {pool.name!r} launches into no reservation, {then}; fix: put "
                           f"your reservation's id there (`aws ec2 describe-capacity-reservations --region "
                           f"{stack_plan.config.region}`)")
    return out


def _code(err: Exception) -> str:
    return str((getattr(err, "response", None) or {}).get("Error", {}).get("Code", ""))


def read_quota(client: Any, code: str) -> tuple[float, str]:
    """(value, name) of one EC2 quota: the account's applied value, else the AWS default."""
    from botocore.exceptions import ClientError

    try:
        q = client.get_service_quota(ServiceCode=SERVICE_CODE, QuotaCode=code)["Quota"]
    except ClientError as err:
        if _code(err) != "NoSuchResourceException":
            raise
        q = client.get_aws_default_service_quota(ServiceCode=SERVICE_CODE, QuotaCode=code)["Quota"]
    return float(q["Value"]), str(q.get("QuotaName") or "")


def check_quotas(stack_plan: Any, client: Any) -> QuotaReport:
    """Every quota the stack's pools need, read with `client` (a boto3 Service Quotas client)."""
    from botocore.exceptions import BotoCoreError, ClientError

    report = QuotaReport(warnings=placeholder_warnings(stack_plan))
    region = stack_plan.config.region
    needs = stack_needs(stack_plan)
    for i, need in enumerate(needs):
        try:
            value, name = read_quota(client, need.code)
        except (ClientError, BotoCoreError) as err:
            code = _code(err)
            why = (f"no permission to read it ({code}); give the deployer servicequotas:GetServiceQuota"
                   if code in DENIED else f"Service Quotas did not answer ({code or type(err).__name__}: {err})")
            report.warnings.append(
                f"could not check EC2 quota \"{need.name}\" ({need.code}) in {region}: {why}. The pools need "
                f"{need.vcpus} vCPUs of it ({', '.join(need.pools)}); check it yourself: `aws service-quotas "
                f"get-service-quota --service-code ec2 --quota-code {need.code} --region {region}`")
            if code not in DENIED:
                # No answer at all: the next quota would only wait as long.
                rest = [f'"{n.name}" ({n.code}, {n.vcpus} vCPUs)' for n in needs[i + 1:]]
                if rest:
                    report.warnings.append(f"not checked either: {', '.join(rest)}")
                break
            continue
        name = name or need.name
        report.checked.append((capacity.QuotaNeed(need.code, name, need.vcpus, need.pools), value))
        if value < need.vcpus:
            report.short.append(QuotaShort(need.code, name, value, need.vcpus, need.pools, region))
    return report


def quotas_client(region: str) -> Any:
    """A Service Quotas client for the deployer's credentials: one attempt, short timeouts (a
    quota that cannot be read is only a warning)."""
    from .preflight import aws_client

    return aws_client("service-quotas", region, attempts=2, read_timeout=10)


def run_quota_preflight(stack_plan: Any, client: Any | None = None) -> QuotaReport:
    """The quota preflight of a stack; the client defaults to the deployer's in the stack's region."""
    if not stack_needs(stack_plan):
        return QuotaReport(warnings=placeholder_warnings(stack_plan))
    return check_quotas(stack_plan, client if client is not None else quotas_client(stack_plan.config.region))
