"""The one harness that runs a Pulumi program under Pulumi mocks: no cloud, no Pulumi CLI.

`run()` runs any callable that registers resources (a whole program file through
`run_program_file()`, or a few components in a test) with the SDK's public testing API
(`pulumi.runtime.set_mocks` with a monitor, `pulumi.runtime.test`) and returns every
registration: type, name, inputs, the URN the engine would give it and the aliases it carries.

The fake cloud answers each registration with its inputs plus the few outputs a real provider
computes that other resources consume (ids, ARNs, names), derived deterministically, so two runs
are byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import runpy
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import pulumi
from pulumi.runtime.mocks import MockMonitor

from . import policies

FAKE_ACCOUNT = "123456789012"
FAKE_PARTITION = "aws"
ROOT_STACK_TYPE = "pulumi:pulumi:Stack"

Synthesizer = Callable[[str, dict[str, Any], str], dict[str, Any]]


def _arn(service: str, region: str, resource: str, global_: bool = False) -> str:
    return f"arn:{FAKE_PARTITION}:{service}:{'' if global_ else region}:{FAKE_ACCOUNT}:{resource}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16].upper()


def _physical(name: str, inputs: dict[str, Any], key: str = "name") -> str:
    return inputs.get(key) or name


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


# Outputs a real provider computes that other resources consume, by Pulumi type token;
# anything not listed echoes its inputs with an id.
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
    # AMP's ids and endpoint in their documented forms
    # (https://docs.aws.amazon.com/prometheus/latest/userguide/AMP-collector-how-to.html).
    "aws:amp/workspace:Workspace": lambda n, i, r: {
        "arn": _arn("aps", r, f"workspace/ws-{_digest(n).lower()}"),
        "prometheusEndpoint": f"https://aps-workspaces.{r}.amazonaws.com/workspaces/ws-{_digest(n).lower()}/"},
    "aws:amp/scraper:Scraper": lambda n, i, r: {
        "arn": _arn("aps", r, f"scraper/s-{_digest(n).lower()}"),
        "roleArn": _arn("iam", r, "role/aws-service-role/scraper.aps.amazonaws.com/"
                        f"AWSServiceRoleForAmazonPrometheusScraper_{_digest(n)[:12]}", True)},
    "aws:eks/nodeGroup:NodeGroup": lambda n, i, r: {
        "arn": _arn("eks", r, f"nodegroup/{i.get('clusterName')}/{_physical(n, i, 'nodeGroupName')}/{_digest(n)}")},
}


def fake_id(typ: str, name: str) -> str:
    prefixes = {"aws:ec2/vpc:Vpc": "vpc-", "aws:ec2/subnet:Subnet": "subnet-",
                "aws:ec2/routeTable:RouteTable": "rtb-", "aws:ec2/vpcEndpoint:VpcEndpoint": "vpce-",
                "aws:ec2/securityGroup:SecurityGroup": "sg-", "aws:ec2/natGateway:NatGateway": "nat-",
                "aws:ec2/internetGateway:InternetGateway": "igw-"}
    return prefixes.get(typ, "") + name


# How the SDK marks a secret value on the wire (pulumi.runtime.rpc's signature key and value):
# the fake cloud, like a provider, sees the plain value inside.
_SIG_KEY, _SECRET_SIG = "4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270"


def _unsecret(value: Any) -> Any:
    if isinstance(value, dict):
        if value.get(_SIG_KEY) == _SECRET_SIG:
            return _unsecret(value.get("value"))
        return {k: _unsecret(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unsecret(v) for v in value]
    return value


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
    """One registration, as the engine would have seen it."""

    typ: str
    name: str
    inputs: dict[str, Any]
    provider: str | None = None
    urn: str = ""
    aliases: tuple[str, ...] = ()
    """Full URNs this resource answers to besides `urn`, as the engine generates them: its own
    aliases, and those inherited from the old URN its parent was matched by (none when the
    parent kept its URN or is new)."""
    old_urn: str | None = None
    """The URN of the old state (`run(olds=...)`) this resource adopts through an alias; None
    when it keeps its own URN or is created."""
    retain_on_delete: bool = False
    """`destroy` would leave the resource in the cloud and only drop it from the state."""
    dependencies: tuple[str, ...] = ()
    """URNs the engine would create (or update) first: `depends_on` (a component's expanded to
    its children) and the resources its inputs come from."""


# What the mocks answer for an existing VPC (`network.vpcId`): its CIDR blocks by id, which tests
# set; any other id gets the range of a default VPC (https://docs.aws.amazon.com/vpc/latest/userguide/default-vpc-components.html),
# which is outside the created VPCs' default 10.0.0.0/16 on purpose.
EXISTING_VPC_CIDR = "172.31.0.0/16"
EXISTING_VPCS: dict[str, list[str]] = {}


@dataclass
class FakeCloud(pulumi.runtime.Mocks):
    """Pulumi mocks that answer like a provider would."""

    region: str
    resources: list[Registered] = field(default_factory=list)
    stack_outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Outputs of other stacks, by the name a `pulumi.StackReference` gives (`org/project/stack`
    or the bare stack name), e.g. a platform stack's render for a model stack's."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        inputs = _integral(_unsecret(dict(args.inputs)))
        self.resources.append(Registered(args.typ, args.name, inputs, args.provider or None))
        if args.typ == STACK_REFERENCE_TYPE:
            # As the engine reads a stack reference: the other stack's outputs, or none.
            ref = str(inputs.get("name", args.name))
            found = self.stack_outputs.get(ref, self.stack_outputs.get(ref.rsplit("/", 1)[-1]))
            return [ref, {"name": ref, "outputs": dict(found or {}), "secretOutputNames": []}]
        outputs = dict(inputs)
        synth = SYNTHESIZERS.get(args.typ)
        if synth:
            outputs |= synth(args.name, inputs, self.region)
        return [fake_id(args.typ, args.name), outputs]

    def call(self, args: pulumi.runtime.MockCallArgs):
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"accountId": FAKE_ACCOUNT, "arn": f"arn:aws:iam::{FAKE_ACCOUNT}:user/render", "userId": "render"}
        if args.token == "aws:iam/getSessionContext:getSessionContext":
            # As the provider answers: an assumed-role session ARN names its role (the mock
            # cannot know a role path, so none); any other ARN passes through.
            arn = str(args.args.get("arn", ""))
            parts = arn.split(":", 5)
            if len(parts) == 6 and parts[2] == "sts" and parts[5].startswith("assumed-role/"):
                _, role, session = parts[5].split("/", 2)
                return {"arn": arn, "issuerArn": f"arn:{parts[1]}:iam::{parts[4]}:role/{role}",
                        "issuerId": "AROA" + _digest(role), "issuerName": role, "sessionName": session}
            return {"arn": arn, "issuerArn": arn, "issuerId": "", "issuerName": "", "sessionName": ""}
        if args.token == "aws:ec2/getVpc:getVpc":
            # An existing VPC's blocks: the offline render cannot ask AWS, so a table the caller
            # gives (tests), else the default VPC's range, which `warmstart render` notes.
            vpc_id = str(args.args.get("id", ""))
            blocks = list(EXISTING_VPCS.get(vpc_id, [EXISTING_VPC_CIDR]))
            return {"id": vpc_id, "cidrBlock": blocks[0], "state": "available",
                    "cidrBlockAssociations": [{"associationId": f"vpc-cidr-assoc-{i}", "cidrBlock": c,
                                               "state": "associated"} for i, c in enumerate(blocks)]}
        if args.token == "aws:eks/getClusters:getClusters":
            # A fresh account: no cluster exists yet, so the program is the one creating them.
            return {"id": self.region, "names": []}
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


STACK_REFERENCE_TYPE = "pulumi:pulumi:StackReference"


def _urn(stack: str, project: str, parent_qualified_type: str, type_: str, name: str) -> str:
    """A URN as the engine builds it: the parent's whole qualified type, never the root stack's."""
    if parent_qualified_type and parent_qualified_type != ROOT_STACK_TYPE:
        type_ = f"{parent_qualified_type}${type_}"
    return f"urn:pulumi:{stack}::{project}::{type_}::{name}"


def _qualified_type(urn: str) -> str:
    return urn.split("::")[2]


class EngineMonitor(MockMonitor):
    """The SDK's mock monitor, made to name and alias resources the way the engine does.

    - URNs carry the parent's whole qualified type and leave out the root stack's type, as
      the engine's `generateURN` does (the SDK's mock keeps only the last parent type).
    - Aliases arrive as alias specs, as with a current engine, and are resolved by the engine's
      rule (pulumi/pulumi `pkg/resource/deploy/step_generator.go`, `generateAliases`,
      `collapseAliasToUrn`, `inheritedChildAlias`, `getOldResource`,
      https://github.com/pulumi/pulumi/blob/1b5949891b3cefcb9974752b24a5ecef0acc86c8/pkg/resource/deploy/step_generator.go#L545-L716):
      each spec against the resource's own name, type and parent (an explicit parent that was
      itself adopted by an alias stands for the old URN it matched); then, when the parent was
      matched in the old state by an alias, that one old URN of the parent (`sg.aliases[parent]`,
      not every alias it declared) is multiplied onto the resource and each of its own aliases
      (a child named after its parent follows the parent's old name). The resource adopts the
      first of its URN and aliases, in that order, that the old state (`olds`) holds.
      https://www.pulumi.com/docs/iac/concepts/options/aliases/
    """

    def __init__(self, mocks: FakeCloud, olds: Iterable[str] = ()) -> None:
        super().__init__(mocks)
        self.fake = mocks
        self.olds = frozenset(olds)
        # The SDK registers from several threads; one registration at a time keeps each
        # record paired with its own URN.
        self._lock = threading.Lock()
        self.alias_urns: dict[str, tuple[str, ...]] = {}
        self.matched: dict[str, str] = {}
        """{URN: the old URN it adopted through an alias}: the engine's `sg.aliases`."""

    def make_urn(self, parent: str, type_: str, name: str) -> str:
        return _urn(pulumi.get_stack(), pulumi.get_project(), _qualified_type(parent) if parent else "", type_, name)

    def _inherited(self, child_type: str, child_name: str, parent_name: str, parent_alias: str) -> str:
        """`inheritedChildAlias`: the child under its parent's old URN, its name's parent prefix
        replaced by the parent's old name."""
        if child_name.startswith(parent_name):
            child_name = parent_alias.rsplit("::", 1)[-1] + child_name[len(parent_name):]
        return _urn(pulumi.get_stack(), pulumi.get_project(), _qualified_type(parent_alias), child_type, child_name)

    def _aliases(self, request, urn: str) -> tuple[str, ...]:
        """`generateAliases`: the resource's aliases in the engine's order, each once."""
        stack, project = pulumi.get_stack(), pulumi.get_project()
        own = []
        for alias in request.aliases:
            if alias.urn:
                own.append(alias.urn)
                continue
            spec = alias.spec
            parent = spec.parentUrn or ""
            # `collapseAliasToUrn`: an explicit parent that was adopted by an alias is its old URN.
            parent = self.matched.get(parent, parent) if parent else request.parent
            if spec.noParent:
                parent = ""
            own.append(_urn(spec.stack or stack, spec.project or project,
                            _qualified_type(parent) if parent else "", spec.type or request.type,
                            spec.name or request.name))
        out = list(own)
        parent_alias = self.matched.get(request.parent) if request.parent else None
        if parent_alias is not None:
            parent_name = request.parent.rsplit("::", 1)[-1]
            out.append(self._inherited(request.type, request.name, parent_name, parent_alias))
            for a in own:
                out.append(self._inherited(_qualified_type(a).split("$")[-1], a.rsplit("::", 1)[-1], parent_name,
                                           parent_alias))
        return tuple(dict.fromkeys(a for a in out if a != urn))

    def RegisterResource(self, request):  # noqa: N802 - gRPC method name
        with self._lock:
            before = len(self.fake.resources)
            response = super().RegisterResource(request)
            aliases = self._aliases(request, response.urn)
            self.alias_urns[response.urn] = aliases
            # `getOldResource`: its own URN first, then its aliases in order.
            adopted = None if response.urn in self.olds else next((a for a in aliases if a in self.olds), None)
            if adopted is not None:
                self.matched[response.urn] = adopted
            if len(self.fake.resources) > before:
                rec = self.fake.resources[-1]
                rec.urn = response.urn
                rec.aliases = tuple(sorted(aliases))
                rec.old_urn = adopted
                rec.retain_on_delete = bool(request.retainOnDelete)
                rec.dependencies = tuple(sorted(set(request.dependencies)))
            return response


def policy_records(resources: Iterable[Registered], region: str) -> list[policies.Resource]:
    """The policy pack's view of what a program registered: each resource's inputs plus the
    outputs the mocks answered (ids, ARNs, names), which other resources referenced."""
    cloud = FakeCloud(region=region)
    out = []
    for r in resources:
        rid, outputs = cloud.new_resource(pulumi.runtime.MockResourceArgs(r.typ, r.name, dict(r.inputs)))
        out.append(policies.Resource(r.typ, r.name, {"id": rid} | outputs))
    return out


def run(program: Callable[[], Any], *, region: str, stack: str, project: str = "warmstart",
        config: dict[str, str] | None = None, stack_outputs: dict[str, dict[str, Any]] | None = None,
        exports: dict[str, Any] | None = None, olds: Iterable[str] = ()) -> list[Registered]:
    """Run `program` under the mocks; every registration, sorted by (type, name).

    `stack_outputs`: other stacks' outputs, for the program's `pulumi.StackReference`s.
    `exports`: a dict that receives the program's `pulumi.export`s, resolved.
    `olds`: the URNs of the stack's state before, which aliases are matched against as the
    engine matches them (each resource's `old_urn`); none: a first deployment."""
    cloud = FakeCloud(region=region, stack_outputs=dict(stack_outputs or {}))
    pulumi.runtime.set_mocks(cloud, project=project, stack=stack, preview=False,
                             monitor=EngineMonitor(cloud, olds))
    pulumi.runtime.set_all_config(dict(config or {}))
    exported: dict[str, Any] = {}
    real_export = pulumi.export

    def capture(name: str, value: Any) -> None:
        exported[name] = value
        real_export(name, value)

    def body() -> Any:
        pulumi.export = capture  # type: ignore[assignment]
        try:
            program()
        finally:
            pulumi.export = real_export  # type: ignore[assignment]
        # The test harness awaits the returned output, so every export is resolved after it.
        return pulumi.Output.all(**{k: pulumi.Output.from_input(v) for k, v in exported.items()}).apply(
            lambda values: exports.update(values) if exports is not None else None) if exported else None

    pulumi.runtime.test(body)()
    return sorted(cloud.resources, key=lambda r: (r.typ, r.name))


def run_program_file(program_dir: Path, *, region: str, stack: str, config: dict[str, str],
                     project: str = "warmstart", stack_outputs: dict[str, dict[str, Any]] | None = None,
                     exports: dict[str, Any] | None = None, olds: Iterable[str] = ()) -> list[Registered]:
    """Run a Pulumi Python program folder (its `__main__.py`) under the mocks.

    The folder goes first on `sys.path`, as Pulumi's Python language host puts it there, so
    the program finds its sibling packages (warmstart's own `components/`) the same way.
    """
    folder = str(program_dir.resolve())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return run(lambda: runpy.run_path(str(Path(folder) / "__main__.py"), run_name="__main__"),
               region=region, stack=stack, project=project, config=config, stack_outputs=stack_outputs,
               exports=exports, olds=olds)
