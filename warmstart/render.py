"""`warmstart render`: run the real Pulumi program under Pulumi mocks and write what it declares.

No cloud, no Pulumi CLI: the mocks stand in for the engine and the providers, answering each
registration with its inputs plus the few outputs a real provider would compute (ids, ARNs,
names), derived deterministically so that two renders are byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pulumi
import yaml
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from . import config as config_mod
from . import plan as plan_mod

FAKE_ACCOUNT = "123456789012"
FAKE_PARTITION = "aws"

Synthesizer = Callable[[str, dict[str, Any], str], dict[str, Any]]


def _arn(service: str, region: str, resource: str, global_: bool = False) -> str:
    return f"arn:{FAKE_PARTITION}:{service}:{'' if global_ else region}:{FAKE_ACCOUNT}:{resource}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16].upper()


def _physical(name: str, inputs: dict[str, Any], key: str = "name") -> str:
    return inputs.get(key) or name


# Outputs a real provider computes that other resources consume. Keyed by Pulumi type token;
# anything not listed just echoes its inputs with an id.
def _eks_cluster(name: str, inputs: dict[str, Any], region: str) -> dict[str, Any]:
    """pulumi-eks Cluster (a remote component: the mocks see only it, not its children)."""
    cluster = _physical(name, inputs)
    issuer = f"oidc.eks.{region}.amazonaws.com/id/{_digest('oidc' + cluster)}"
    endpoint = f"https://{_digest(cluster)}.gr7.{region}.eks.amazonaws.com"
    kubeconfig = {
        "apiVersion": "v1", "kind": "Config", "current-context": "aws",
        "clusters": [{"name": "kubernetes", "cluster": {"server": endpoint, "certificate-authority-data": "RkFLRQ=="}}],
        "contexts": [{"name": "aws", "context": {"cluster": "kubernetes", "user": "aws"}}],
        "users": [{"name": "aws", "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                                                      "command": "aws", "args": ["eks", "get-token", "--cluster-name",
                                                                                 cluster, "--region", region]}}}],
    }
    security_group = "sg-" + _digest("cluster-sg" + cluster).lower()
    return {
        "kubeconfigJson": json.dumps(kubeconfig, sort_keys=True),
        "oidcIssuer": issuer,
        "oidcProviderUrl": f"https://{issuer}",
        "oidcProviderArn": _arn("iam", region, f"oidc-provider/{issuer}", True),
        "clusterSecurityGroupId": security_group,
        "nodeSecurityGroupId": security_group,
        "autoModeNodeRoleName": f"{cluster}-auto-node" if inputs.get("autoMode") else "",
    }


SYNTHESIZERS: dict[str, Synthesizer] = {
    "aws:iam/role:Role": lambda n, i, r: {"arn": _arn("iam", r, f"role/{_physical(n, i)}", True),
                                          "name": _physical(n, i), "uniqueId": "AROA" + _digest(n)},
    "aws:iam/policy:Policy": lambda n, i, r: {"arn": _arn("iam", r, f"policy/{_physical(n, i)}", True),
                                              "name": _physical(n, i)},
    "aws:iam/openIdConnectProvider:OpenIdConnectProvider": lambda n, i, r: {
        "arn": _arn("iam", r, "oidc-provider/" + str(i.get("url", n)).removeprefix("https://"), True)},
    "aws:s3/bucket:Bucket": lambda n, i, r: {"arn": f"arn:aws:s3:::{_physical(n, i, 'bucket')}",
                                             "bucket": _physical(n, i, "bucket")},
    "aws:s3/bucketV2:BucketV2": lambda n, i, r: {"arn": f"arn:aws:s3:::{_physical(n, i, 'bucket')}",
                                                 "bucket": _physical(n, i, "bucket")},
    "aws:ec2/eip:Eip": lambda n, i, r: {"allocationId": "eipalloc-" + _digest(n).lower(),
                                        "publicIp": "192.0.2." + str(int(_digest(n)[:2], 16))},
    "aws:sqs/queue:Queue": lambda n, i, r: {"arn": _arn("sqs", r, _physical(n, i)),
                                            "url": f"https://sqs.{r}.amazonaws.com/{FAKE_ACCOUNT}/{_physical(n, i)}"},
    "eks:index:Cluster": _eks_cluster,
    "aws:cloudwatch/eventRule:EventRule": lambda n, i, r: {"arn": _arn("events", r, f"rule/{_physical(n, i)}"),
                                                           "name": _physical(n, i)},
    "aws:cloudwatch/logGroup:LogGroup": lambda n, i, r: {"arn": _arn("logs", r, f"log-group:{_physical(n, i)}")},
    "aws:eks/nodeGroup:NodeGroup": lambda n, i, r: {
        "arn": _arn("eks", r, f"nodegroup/{i.get('clusterName')}/{_physical(n, i, 'nodeGroupName')}/{_digest(n)}")},
}


def _fake_id(typ: str, name: str) -> str:
    prefixes = {"aws:ec2/vpc:Vpc": "vpc-", "aws:ec2/subnet:Subnet": "subnet-",
                "aws:ec2/routeTable:RouteTable": "rtb-", "aws:ec2/vpcEndpoint:VpcEndpoint": "vpce-",
                "aws:ec2/securityGroup:SecurityGroup": "sg-", "aws:ec2/natGateway:NatGateway": "nat-",
                "aws:ec2/internetGateway:InternetGateway": "igw-"}
    return prefixes.get(typ, "") + name


def _integral(value: Any) -> Any:
    """Pulumi's wire format carries every number as a double; give integers back their type."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value


@dataclass
class Registered:
    typ: str
    name: str
    inputs: dict[str, Any]
    provider: str | None = None


@dataclass
class FakeCloud(pulumi.runtime.Mocks):
    """Pulumi mocks that record every registration and answer like a provider would."""

    region: str
    resources: list[Registered] = field(default_factory=list)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        inputs = _integral(dict(args.inputs))
        self.resources.append(Registered(args.typ, args.name, inputs, args.provider or None))
        outputs = dict(inputs)
        synth = SYNTHESIZERS.get(args.typ)
        if synth:
            outputs |= synth(args.name, inputs, self.region)
        return [_fake_id(args.typ, args.name), outputs]

    def call(self, args: pulumi.runtime.MockCallArgs):
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"accountId": FAKE_ACCOUNT, "arn": f"arn:aws:iam::{FAKE_ACCOUNT}:user/render", "userId": "render"}
        if args.token == "aws:index/getPartition:getPartition":
            return {"partition": FAKE_PARTITION, "dnsSuffix": "amazonaws.com"}
        if args.token == "aws:index/getRegion:getRegion":
            return {"name": self.region, "region": self.region}
        if args.token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            # Four AZs, a-d, as most regions report; the network layer takes the first azCount.
            letters = "abcd"
            return {"names": [f"{self.region}{c}" for c in letters],
                    "zoneIds": [f"{self.region[:2]}{self.region.split('-')[-1]}-az{i + 1}" for i in range(len(letters))],
                    "id": self.region, "state": "available"}
        return {}


@dataclass
class Rendered:
    """What a stack declares."""

    stack_plan: plan_mod.StackPlan
    resources: list[Registered]

    @property
    def kubernetes_objects(self) -> list[dict[str, Any]]:
        return [r.inputs for r in self.resources if is_kubernetes_object(r)]

    @property
    def cloud_resources(self) -> list[Registered]:
        return [r for r in self.resources if not is_kubernetes_object(r) and not r.typ.startswith(("pulumi:providers:", "warmstart:"))]

    def of_type(self, typ: str) -> list[Registered]:
        return [r for r in self.resources if r.typ == typ]

    def kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.kubernetes_objects if o.get("kind") == kind]


def is_kubernetes_object(r: Registered) -> bool:
    return r.typ.startswith("kubernetes:") and "apiVersion" in r.inputs and "kind" in r.inputs


def load_plan(stacks_dir: Path, stack: str) -> tuple[dict[str, str], plan_mod.StackPlan]:
    """Read, validate and plan a stack file; ConfigError(s) on any broken rule."""
    raw = config_mod.read_stack_file(config_mod.stack_file(stacks_dir, stack))
    return raw, plan_mod.plan_stack(config_mod.from_pulumi_config(raw), stack)


def run_program(stacks_dir: Path, stack: str) -> Rendered:
    """Validate the stack config, then run the Pulumi program under mocks."""
    raw, stack_plan = load_plan(stacks_dir, stack)
    from . import program  # imported late: it pulls in the providers' SDKs

    mocks = FakeCloud(region=stack_plan.config.region)
    pulumi.runtime.set_mocks(mocks, project="warmstart", stack=stack, preview=False)
    pulumi.runtime.set_all_config(raw)
    settings = pulumi.runtime.settings.SETTINGS
    settings.rpc_manager.clear()
    settings.outputs.clear()
    _sync_await(run_pulumi_func(program.main))
    resources = sorted(mocks.resources, key=lambda r: (r.typ, r.name))
    return Rendered(stack_plan, resources)


# Apply order for `kubectl apply -f DIR/kubernetes`: files sort by this rank first.
_APPLY_RANK = {"Namespace": 0, "CustomResourceDefinition": 0, "ServiceAccount": 1, "ConfigMap": 1,
               "ClusterRole": 1, "Role": 1, "ClusterRoleBinding": 2, "RoleBinding": 2}


def _ordered(obj: Any) -> Any:
    """Keys sorted everywhere, apiVersion/kind/metadata first at the top, as kubectl shows."""
    if isinstance(obj, dict):
        return {k: _ordered(obj[k]) for k in sorted(obj)}
    if isinstance(obj, list):
        return [_ordered(v) for v in obj]
    return obj


def object_yaml(obj: dict[str, Any]) -> str:
    head = {k: obj[k] for k in ("apiVersion", "kind", "metadata") if k in obj}
    rest = {k: v for k, v in obj.items() if k not in head}
    doc = {k: _ordered(v) for k, v in head.items()} | _ordered(rest)
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100)


def object_filename(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    rank = _APPLY_RANK.get(obj["kind"], 5)
    parts = [str(rank), obj["kind"].lower(), meta.get("namespace"), meta.get("name", "unnamed")]
    return "-".join(p for p in parts if p) + ".yaml"


MARKER = ".warmstart-render"


class OutputDirNotOurs(Exception):
    """The output folder holds files a render did not write; nothing is deleted."""


def write(rendered: Rendered, out: Path) -> None:
    """Write DIR/kubernetes/*.yaml, DIR/cloud.json and DIR/plan.json.

    A previous render's files are replaced; a folder that holds anything else is refused, so
    `--out` pointed at the wrong place never deletes a user's files.
    """
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise OutputDirNotOurs(f"{out} is not empty and was not written by warmstart render; "
                                   "choose an empty or new --out folder")
        shutil.rmtree(out / "kubernetes", ignore_errors=True)
    (out / "kubernetes").mkdir(parents=True)
    (out / MARKER).write_text("written by `warmstart render`; the folder is replaced on every render\n")
    for obj in rendered.kubernetes_objects:
        (out / "kubernetes" / object_filename(obj)).write_text(object_yaml(obj))
    cloud = [{"type": r.typ, "name": r.name, "inputs": r.inputs} for r in rendered.cloud_resources]
    (out / "cloud.json").write_text(json.dumps(cloud, indent=2, sort_keys=True) + "\n")
    (out / "plan.json").write_text(json.dumps(rendered.stack_plan.summary(), indent=2, sort_keys=True) + "\n")


def table(stack_plan: plan_mod.StackPlan) -> str:
    """One row per model: the decisions a reviewer checks first."""
    head = ("model", "instance", "gpus/node", "TP", "weights GiB", "concurrency", "distributed",
            "compile cache", "startup budget")
    rows = [head]
    for m in stack_plan.models:
        rows.append((m.name, m.instance.instance_type, str(m.instance.gpu_count), str(m.tensor_parallel_size),
                     f"{m.weights_bytes / 2**30:.1f}", str(m.concurrency), "yes" if m.distributed else "no",
                     m.compile_cache_host_path if m.compile_cache else "off (eager)" if m.eager else "off",
                     f"{m.startup_budget_seconds}s"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    unpinned = sorted({m.image for m in stack_plan.models if "@sha256:" not in m.image})
    if unpinned:
        lines.append(f"note: image(s) not pinned by digest: {', '.join(unpinned)}")
    return "\n".join(lines)
