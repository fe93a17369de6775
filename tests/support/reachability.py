"""Who can reach whom in a rendered stack: Kubernetes NetworkPolicy as the AWS VPC CNI
network-policy agent enforces it, and the flows every stack must allow and must deny.

The semantics, as read in the sources (not copied):

- aws/amazon-network-policy-controller-k8s `pkg/resolvers/endpoints.go` at ecc7e6a79394
  (`computeEgressEndpoints`, `computeIngressEndpoints`, `getMatchingServiceClusterIPs`,
  `hasTargetPortBypass`) and `pkg/k8s/{pod_utils.go,service_utils.go}`: the controller turns a
  policy into address/port lists. An `ipBlock` peer is its CIDR minus `except`, nothing more; a
  rule without `to`/`from` is 0.0.0.0/0; a rule without `ports` is every port. A pod/namespace
  selector peer becomes the selected pods' IPs, and, for egress only, the ClusterIP of every
  non-headless Service in the peer's namespaces whose `spec.selector`, read as a label set, is
  matched by the peer's podSelector (an absent one matching all), on the Service's listen port
  whose targetPort is the policy's port (by name or number, else through the backing pods'
  container ports); a numeric policy port is dropped for a Service whose named targetPort
  resolves on some backing pod to a port the rule does not allow. Egress named ports resolve
  per destination pod and never for a CIDR (a CIDR peer with only named ports is skipped);
  ingress named ports resolve against every pod the policy selects; either way only against
  `containers` (LookupContainerPortAndName), never a native sidecar's (init container) ports.
- aws/aws-network-policy-agent `pkg/ebpf/c/tc.v4egress.bpf.c` at c8619c056b4c (`handle_egress`):
  egress is matched on the packet's destination address as the pod sent it, at the pod's veth,
  before kube-proxy's DNAT: traffic to a Service is judged on its ClusterIP and Service port.
  Ingress is judged at the destination pod on the source address and the target port.
- https://kubernetes.io/docs/concepts/services-networking/network-policies/: a pod is isolated
  for a direction once any policy selecting it lists that direction in `policyTypes` (default:
  Ingress, plus Egress when the policy has egress rules); policies add up.

With the VPC CNI pod IPs are VPC addresses
(https://docs.aws.amazon.com/eks/latest/userguide/managing-vpc-cni.html), so here every pod gets
an address of the cluster's private subnets, and an `ipBlock` of the VPC CIDR matches them all.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from warmstart.decisions import network
from warmstart.manifests import autoscaling as autoscaling_objects
from warmstart.mocks import fake_id

Net = ipaddress.IPv4Network
NAME_LABEL = "kubernetes.io/metadata.name"
NAME, INSTANCE, COMPONENT = "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component"


@dataclass(eq=False)
class Endpoint:
    """A pod (`namespace` set) or an address outside the pod network's policies."""

    name: str
    ip: ipaddress.IPv4Address
    role: str
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    ports: Sequence[tuple[str, int, str]] = ()
    """Container ports: (name, number, protocol)."""
    model: str | None = None
    sidecar_ports: Sequence[tuple[str, int, str]] = ()
    """Ports of native sidecars (init containers with restartPolicy Always)."""
    node: str | None = None
    """The node a pod runs on, or whose own IP an endpoint is (role `node`)."""

    def named_port(self, name: str, proto: str = "TCP") -> int | None:
        """A named port as a policy resolves it: in `containers` only (the controller's
        LookupContainerPortAndName and firstNamedPort read pod.Spec.Containers, not the init
        containers a native sidecar is)."""
        return next((n for nm, n, p in self.ports if nm == name and p == proto), None)

    def listening(self, name: str, proto: str = "TCP") -> int | None:
        """The number a named port listens on, in any container of the pod, sidecars included."""
        return self.named_port(name, proto) or next(
            (n for nm, n, p in self.sidecar_ports if nm == name and p == proto), None)


@dataclass(eq=False)
class Service:
    name: str
    namespace: str
    cluster_ip: ipaddress.IPv4Address
    selector: Mapping[str, str] | None
    """None: no selector (the endpoints are `backends`, e.g. `default/kubernetes`)."""
    ports: Sequence[tuple[str, int, int | str, str]]
    """(name, port, targetPort, protocol)."""
    backends: Sequence[Endpoint] = ()

    def port(self, key: int | str, proto: str = "TCP") -> tuple[int, int | str]:
        return next((p, t) for n, p, t, pr in self.ports if key in (n, p) and pr == proto)


# ---------------------------------------------------------------------------------------------
# The evaluator


def matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector (None or {} selects everything)."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        k, op, vals = e["key"], e["operator"], e.get("values") or []
        ok = {"In": k in labels and labels[k] in vals, "NotIn": labels.get(k) not in vals,
              "Exists": k in labels, "DoesNotExist": k not in labels}[op]
        if not ok:
            return False
    return True


def _in_block(ip: ipaddress.IPv4Address, block: Mapping[str, Any]) -> bool:
    return ip in ipaddress.ip_network(block["cidr"]) and not any(
        ip in ipaddress.ip_network(e) for e in block.get("except") or [])


def _port_ok(allowed: list[tuple[str, int | None, int | None]] | None, port: int, proto: str) -> bool:
    """`allowed` None: every port; else (protocol, first or None for all, last)."""
    return allowed is None or any(p == proto and (lo is None or lo <= port <= (hi or lo)) for p, lo, hi in allowed)


def _numeric(ports: list[dict[str, Any]]) -> list[tuple[str, int | None, int | None]] | None:
    """A rule's ports for a CIDR (or no peer at all): named ones cannot apply and are dropped;
    None when the rule has no ports (all of them)."""
    if not ports:
        return None
    return [(p.get("protocol", "TCP"), p.get("port"), p.get("endPort")) for p in ports
            if not isinstance(p.get("port"), str)]


def _on_pod(ports: list[dict[str, Any]], pod: Endpoint) -> list[tuple[str, int | None, int | None]] | None:
    """A rule's ports resolved against one pod's container ports (a name it lacks is dropped)."""
    if not ports:
        return None
    out = []
    for p in ports:
        proto, port = p.get("protocol", "TCP"), p.get("port")
        if isinstance(port, str):
            port = pod.named_port(port, proto)
            if port is None:
                continue
        out.append((proto, port, p.get("endPort")))
    return out


class Cluster:
    """Policies, pods, Services and namespaces; `reach()` says whether a connection opens."""

    def __init__(self, policies: Iterable[Mapping[str, Any]], pods: Iterable[Endpoint],
                 services: Iterable[Service] = (), namespaces: Mapping[str, Mapping[str, str]] | None = None):
        self.policies = list(policies)
        self.pods = [p for p in pods if p.namespace is not None]
        self.services = list(services)
        names = {p.namespace for p in self.pods} | {s.namespace for s in self.services} | {
            p["metadata"].get("namespace", "default") for p in self.policies}
        self.namespaces = {n: {NAME_LABEL: n} for n in names} | {
            n: {NAME_LABEL: n, **labels} for n, labels in (namespaces or {}).items()}

    def _ns(self, policy: Mapping[str, Any]) -> str:
        return policy["metadata"].get("namespace", "default")

    def selecting(self, pod: Endpoint, direction: str) -> list[Mapping[str, Any]]:
        """The policies that isolate `pod` for `direction` ("Ingress" or "Egress")."""
        def types(spec):
            return spec.get("policyTypes") or ["Ingress"] + (["Egress"] if spec.get("egress") else [])
        return [p for p in self.policies if self._ns(p) == pod.namespace and direction in types(p["spec"])
                and matches(p["spec"].get("podSelector"), pod.labels)]

    def _peer_namespaces(self, policy, peer) -> list[str]:
        if "namespaceSelector" not in peer:
            return [self._ns(policy)]
        return [n for n, labels in self.namespaces.items() if matches(peer["namespaceSelector"], labels)]

    def _service_ports(self, svc: Service, rule_ports: list[dict[str, Any]]):
        """The Service listen ports a selector peer's rule allows on the Service's ClusterIP."""
        if not rule_ports:
            return None
        backends = [p for p in self.pods if p.namespace == svc.namespace and svc.selector
                    and matches({"matchLabels": svc.selector}, p.labels)]
        out = []
        for rp in rule_ports:
            proto, port = rp.get("protocol", "TCP"), rp.get("port")
            if port is None:
                out.append((proto, None, None))
                continue
            # the listen port whose targetPort is the policy's port, else through a backend pod
            listen = next((p for _, p, t, pr in svc.ports if pr == proto and t == port), None)
            for pod in backends if listen is None else ():
                number = pod.named_port(port, proto) if isinstance(port, str) else port
                name = next((n for n, num, pr in pod.ports if num == number and pr == proto), None)
                listen = next((p for _, p, t, pr in svc.ports if pr == proto and t in (number, name)), None)
                if listen is not None:
                    break
            if listen is None:
                continue
            target = next(t for _, p, t, pr in svc.ports if p == listen and pr == proto)
            if isinstance(port, int) and isinstance(target, str) and any(
                    not _port_ok(_numeric(rule_ports), n, proto)
                    for n in (b.named_port(target, proto) for b in backends) if n is not None):
                continue  # hasTargetPortBypass: the name leads to a port the rule does not allow
            out.append((proto, listen, rp.get("endPort")))
        return out

    def _egress_peer_ok(self, policy, rule, peer, ip, port, proto) -> bool:
        ports = rule.get("ports") or []
        if "ipBlock" in peer:
            return _in_block(ip, peer["ipBlock"]) and _numeric(ports) != [] and _port_ok(_numeric(ports), port, proto)
        namespaces = self._peer_namespaces(policy, peer)
        for pod in self.pods:
            if pod.ip == ip and pod.namespace in namespaces and matches(peer.get("podSelector"), pod.labels):
                allowed = _on_pod(ports, pod)
                if allowed != [] and _port_ok(allowed, port, proto):
                    return True
        for svc in self.services:  # getMatchingServiceClusterIPs
            if (svc.cluster_ip == ip and svc.namespace in namespaces
                    and matches(peer.get("podSelector"), dict(svc.selector or {}))):
                allowed = self._service_ports(svc, ports)
                if allowed != [] and _port_ok(allowed, port, proto):
                    return True
        return False

    def egress(self, src: Endpoint, ip: ipaddress.IPv4Address, port: int, proto: str) -> str:
        """'' when `src` may send to ip:port (pre-DNAT address), else why not."""
        if src.namespace is None:
            return ""
        policies = self.selecting(src, "Egress")
        for policy in policies:
            for rule in policy["spec"].get("egress") or []:
                if not rule.get("to"):
                    allowed = _numeric(rule.get("ports") or [])
                    if allowed != [] and _port_ok(allowed, port, proto):
                        return ""
                elif any(self._egress_peer_ok(policy, rule, peer, ip, port, proto) for peer in rule["to"]):
                    return ""
        if not policies:
            return ""
        return f"egress to {ip}:{port}/{proto} matches no rule of {_names(policies)}"

    def ingress(self, dst: Endpoint, src: Endpoint, port: int, proto: str) -> str:
        """'' when `dst` accepts a connection from `src` on its (target) `port`, else why not.
        The agent puts the node's own IP in every pod's map, allowed on every port: "Traffic from
        the local node should always be allowed" (aws/aws-network-policy-agent
        `pkg/fwruleprocessor/fw_rule_processor.go`, ComputeMapEntriesFromEndpointRules)."""
        if dst.namespace is None:
            return ""
        if src.role == "node" and src.node is not None and src.node == dst.node:
            return ""
        policies = self.selecting(dst, "Ingress")
        for policy in policies:
            selected = [p for p in self.pods if p.namespace == dst.namespace
                        and matches(policy["spec"].get("podSelector"), p.labels)]
            for rule in policy["spec"].get("ingress") or []:
                ports = rule.get("ports") or []
                allowed = None if not ports else list({a for pod in selected for a in _on_pod(ports, pod)})
                if allowed == [] or not _port_ok(allowed, port, proto):
                    continue
                peers = rule.get("from")
                if not peers or any(self._ingress_peer_ok(policy, peer, src) for peer in peers):
                    return ""
        if not policies:
            return ""
        return f"ingress from {src.ip} on {port}/{proto} matches no rule of {_names(policies)}"

    def _ingress_peer_ok(self, policy, peer, src: Endpoint) -> bool:
        if "ipBlock" in peer:
            return _in_block(src.ip, peer["ipBlock"])
        return (src.namespace is not None and src.namespace in self._peer_namespaces(policy, peer)
                and matches(peer.get("podSelector"), src.labels))

    def reach(self, src: Endpoint, dst: Endpoint | Service, port: int | str, proto: str = "TCP") -> str:
        """'' when `src` can open a connection to `dst` on `port` (a number, or a named port of
        the destination pod or Service), else why not. A Service is judged on its ClusterIP and
        port leaving `src`, then on each backend pod's target port: all must accept."""
        if isinstance(dst, Service):
            listen, target = dst.port(port, proto)
            why = self.egress(src, dst.cluster_ip, listen, proto)
            if why:
                return why
            backends = list(dst.backends) or [p for p in self.pods if p.namespace == dst.namespace and dst.selector
                                              and matches({"matchLabels": dst.selector}, p.labels)]
            if not backends:
                return f"Service {dst.namespace}/{dst.name} has no backend"
            for b in backends:
                number = b.named_port(target, proto) if isinstance(target, str) else target
                why = f"{b.name} has no port {target!r}" if number is None else self.ingress(b, src, number, proto)
                if why:
                    return f"at {b.name}: {why}"
            return ""
        number = dst.listening(port, proto) if isinstance(port, str) else port
        if number is None:
            raise KeyError(f"{dst.name} declares no container port named {port!r}")
        return self.egress(src, dst.ip, number, proto) or self.ingress(dst, src, number, proto)


def _names(policies) -> str:
    return ", ".join(f"{p['metadata'].get('namespace', 'default')}/{p['metadata']['name']}" for p in policies)


# ---------------------------------------------------------------------------------------------
# A rendered stack as endpoints

WORKLOADS = ("Deployment", "DaemonSet", "Job", "StatefulSet")
ROLES = {(NAME, "vllm"): "vllm", (NAME, "router"): "router", (NAME, "weights-import"): "import",
         (COMPONENT, "weights-staging"): "staging", (COMPONENT, "image-prepull"): "prepull",
         (NAME, "warmstart-warm-spare"): "warm-spare", (NAME, "standby-actuator"): "actuator",
         (NAME, "warmstart-standby-pool"): "pool-actuator", (NAME, "warmstart-engine-host"): "engine-host"}
# A standby pool's host Deployment names its members (manifests/standby_pool.py): its pool actuator
# is each member's actuator.
POOL_MEMBERS_ANNOTATION = "warmstart.io/standby-pool-members"
# Documentation addresses (RFC 5737) stand for S3 (through the VPC's gateway endpoint its
# addresses stay public: the endpoint's managed prefix list), regional STS and the Hugging Face
# Hub: public addresses no NetworkPolicy here can name, so any public address serves.
S3_IP, STS_IP, HUB_IP = (ipaddress.ip_address(a) for a in ("198.51.100.10", "198.51.100.20", "203.0.113.30"))


@dataclass
class Network:
    vpc_cidrs: Sequence[Net]
    pod_subnets: Sequence[Net]
    """Where pods get addresses: the cluster's private subnets (the VPC CNI's default)."""
    scraper_subnets: Sequence[Net]
    """The subnets the AMP managed collector's ENIs are in; empty without one."""
    service_cidr: Net
    auto_mode: bool


def network_of(rendered, platform=None, *, vpc_cidrs: Sequence[str] = (),
               subnet_cidrs: Mapping[str, str] | None = None) -> Network:
    """The stack's network, from its render (a model stack's from its platform's). An existing
    VPC's CIDRs and subnets are not in a render: pass them (`vpc_cidrs`, `subnet_cidrs` by id)."""
    res = (platform or rendered).resources
    subnets = {fake_id(r.typ, r.name): ipaddress.ip_network(r.inputs["cidrBlock"])
               for r in res if r.typ == "aws:ec2/subnet:Subnet"}
    subnets |= {k: ipaddress.ip_network(v) for k, v in (subnet_cidrs or {}).items()}
    vpcs = [ipaddress.ip_network(c) for c in vpc_cidrs] or [
        ipaddress.ip_network(r.inputs["cidrBlock"]) for r in res
        if r.typ in ("aws:ec2/vpc:Vpc", "aws:ec2/vpcIpv4CidrBlockAssociation:VpcIpv4CidrBlockAssociation")]
    if not vpcs:  # an existing VPC without its CIDRs given: what the plan takes it to be
        plan = rendered.stack_plan
        contract = getattr(plan, "contract", None)
        cidrs = contract.vpc_cidrs if contract else [plan.config.network.cidr]
        vpcs = [ipaddress.ip_network(c) for c in cidrs]
    cluster = next(r.inputs for r in res if r.typ == "eks:index:Cluster")
    pods = [subnets[i] for i in cluster.get("privateSubnetIds") or [] if i in subnets] or vpcs
    scraper = next((r.inputs for r in res if r.typ == "aws:amp/scraper:Scraper"), None)
    scraper_subnets = [] if scraper is None else [
        subnets[i] for i in scraper["source"]["eks"].get("subnetIds") or [] if i in subnets] or vpcs
    service = cluster.get("kubernetesServiceIpAddressRange") or (
        cluster.get("kubernetesNetworkConfig") or {}).get("serviceIpv4Cidr")
    return Network(vpcs, pods, scraper_subnets,
                   ipaddress.ip_network(service or network.default_service_cidr([str(c) for c in vpcs])),
                   rendered.stack_plan.cluster_mode == "auto")


def hub_models(plan) -> set[str]:
    """The models of a plan whose weights import downloads from the Hugging Face Hub."""
    return {m.name for m in (plan.models if plan else ())
            if m.weights_import is not None and m.weights_import.source.startswith("hf://")}


def named_scrapers(plan) -> list[tuple[str, Mapping[str, str]]]:
    """(namespace, pod labels) of the user's Prometheus pods: `monitoring.scraper` of an
    environment stack, its platform's `monitoring.scraper_pods` for a model stack."""
    contract = getattr(plan, "contract", None)
    if contract is not None:
        return contract.scraper_pods
    scraper = getattr(getattr(getattr(plan, "config", None), "monitoring", None), "scraper", None)
    return [] if scraper is None else [(scraper.namespace, dict(scraper.pod_labels))]


@dataclass
class Stack:
    name: str
    cluster: Cluster
    sources: list[Endpoint]
    """Every endpoint that may open a connection: the render's pods, stand-ins, the collector."""
    api: Service
    dns: Endpoint | Service
    services: dict[str, Service]
    exposed: set[str]
    hub_imports: set[str]
    snat_exposed: set[str] = field(default_factory=set)
    """Models whose load balancer reaches the routers through a NodePort with SNAT (instance
    targets, `externalTrafficPolicy: Cluster`): its clients arrive as the receiving node's IP."""
    from_zero: set[str] = field(default_factory=set)
    """Models KEDA scales from zero pods on their routers' front queues (a ScaledObject with a
    metrics-api trigger): its operator dials each router pod itself."""
    pool_members: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Standby pools' members, by pool: the pool's actuator is each member's actuator."""

    @property
    def models(self) -> list[str]:
        return sorted({e.model for e in self.sources if e.role == "vllm"})


def stack_model(name: str, rendered, platform=None, *, network: Network | None = None,
                prometheus: Sequence[tuple[str, Mapping[str, str]]] | None = None,
                objects: Sequence[Mapping[str, Any]] | None = None, hub_imports: set[str] | None = None) -> Stack:
    """The stack as endpoints: one pod per pod template the render declares (`objects`, by
    default the render's Kubernetes objects: a whole cluster's, its platform's and model stacks'
    together), plus what the cluster and AWS put around them. `hub_imports`: the models whose
    import downloads from the Hub (default: the render's plan's)."""
    net = network or network_of(rendered, platform)
    objects = rendered.kubernetes_objects if objects is None else objects
    hosts = (s.network_address + 10 + i for i in range(200) for s in net.pod_subnets)
    pods: list[Endpoint] = []
    for o in objects:
        if o["kind"] not in WORKLOADS or o["spec"]["template"]["spec"].get("hostNetwork"):
            continue
        tpl, ns = o["spec"]["template"], o["metadata"].get("namespace", "default")
        labels = tpl["metadata"].get("labels") or {}
        role = next((r for (k, v), r in ROLES.items() if labels.get(k) == v), "pod")
        def ports(containers):
            return [(p.get("name", ""), p["containerPort"], p.get("protocol", "TCP"))
                    for c in containers for p in c.get("ports") or []]
        sidecars = [c for c in tpl["spec"].get("initContainers") or [] if c.get("restartPolicy") == "Always"]
        model = None if role == "warm-spare" else labels.get(INSTANCE)
        # GPU pods share a node with their model's other GPU pods, never with a router (the GPU taint).
        gpu = bool(tpl["spec"].get("tolerations") and any(t.get("key") == "nvidia.com/gpu"
                                                           for t in tpl["spec"]["tolerations"]))
        node = f"GPU node of {model or o['metadata']['name']}" if gpu else "CPU node"
        pods.append(Endpoint(f"{ns}/{o['metadata']['name']}", next(hosts), role, ns, labels,
                             ports(tpl["spec"].get("containers") or []), model, ports(sidecars), node))
    # Stand-ins: any other pod of the models' namespaces, a pod of a foreign namespace.
    pods += [Endpoint(f"{ns}/another-pod", next(hosts), "client", ns, {NAME: "another-pod"})
             for ns in sorted({p.namespace for p in pods})]
    pods.append(Endpoint("elsewhere/another-pod", next(hosts), "foreign", "elsewhere", {NAME: "another-pod"}))
    scaled = [o for o in objects if o["kind"] == "ScaledObject"]
    if scaled:
        # KEDA's pods as the kedacore/keda chart 2.20.2 labels them (templates/manager/deployment.yaml,
        # templates/metrics-server/deployment.yaml), in the namespace warmstart installs it into.
        op = autoscaling_objects.KEDA_OPERATOR_LABELS["app"]
        pods.append(Endpoint(f"{autoscaling_objects.KEDA_NAMESPACE}/{op}", next(hosts), "keda-operator",
                             autoscaling_objects.KEDA_NAMESPACE, {"app": op, "name": op, NAME: op}))
        metrics = f"{op}-metrics-apiserver"
        pods.append(Endpoint(f"{autoscaling_objects.KEDA_NAMESPACE}/{metrics}", next(hosts), "foreign",
                             autoscaling_objects.KEDA_NAMESPACE, {"app": metrics, NAME: metrics}))
    # (a standby model's metrics-api trigger reads its actuator's Service, not the routers)
    from_zero = {o["metadata"]["name"] for o in scaled
                 if any(t["type"] == "metrics-api" and t["metadata"].get("aggregateFromKubeServiceEndpoints") == "true"
                        for t in o["spec"]["triggers"])}
    plan = getattr(rendered, "stack_plan", None)  # None: a program of components alone (examples/)
    for ns, labels in named_scrapers(plan) if prometheus is None else prometheus:
        pods.append(Endpoint(f"{ns}/prometheus", next(hosts), "scraper", ns, labels, [("web", 9090, "TCP")]))
        # admitted by its labels, not its namespace: a neighbour of it is an outsider
        pods.append(Endpoint(f"{ns}/another-pod", next(hosts), "foreign", ns, {NAME: "another-pod"}))
    svc_ip = net.service_cidr.network_address
    api = Service("kubernetes", "default", svc_ip + 1, None, [("https", 443, 443, "TCP")],
                  [Endpoint("EKS API endpoint ENI", net.pod_subnets[0].network_address + 5, "api")])
    services = [api]
    if net.auto_mode:
        # Auto Mode: the resolver runs on the node, answering at the cluster DNS address; there
        # are no kube-dns pods or Service (https://github.com/aws/containers-roadmap/issues/2552).
        dns: Endpoint | Service = Endpoint("node-local DNS (Auto Mode)", svc_ip + 10, "dns")
    else:
        pods.append(Endpoint("kube-system/coredns", next(hosts), "coredns", "kube-system", {"k8s-app": "kube-dns"},
                             [("dns", 53, "UDP"), ("dns-tcp", 53, "TCP"), ("metrics", 9153, "TCP")]))
        dns = Service("kube-dns", "kube-system", svc_ip + 10, {"k8s-app": "kube-dns"},
                      [("dns", 53, 53, "UDP"), ("dns-tcp", 53, 53, "TCP")])
        services.append(dns)
    by_model, exposed, snat = {}, set(), set()
    for i, o in enumerate(o for o in objects if o["kind"] == "Service"):
        spec = o["spec"]
        svc = Service(o["metadata"]["name"], o["metadata"].get("namespace", "default"), svc_ip + 100 + i,
                      spec.get("selector"), [(p.get("name", ""), p["port"], p.get("targetPort", p["port"]),
                                              p.get("protocol", "TCP")) for p in spec.get("ports") or []])
        services.append(svc)
        if o["metadata"]["name"] == (spec.get("selector") or {}).get(INSTANCE):  # the model's own Service
            by_model[o["metadata"]["name"]] = svc
        if spec.get("type") == "LoadBalancer":
            exposed.add((spec.get("selector") or {}).get(INSTANCE))
            # Without a load balancer class the cloud provider's NLB has instance targets.
            if not spec.get("loadBalancerClass") and spec.get("externalTrafficPolicy", "Cluster") == "Cluster":
                snat.add((spec.get("selector") or {}).get(INSTANCE))
    sources = list(pods) + [Endpoint("a VPC client outside the cluster", net.pod_subnets[0].broadcast_address - 8,
                                     "vpc-client")]
    # Each node's own IP: its hostNetwork pods, and what kube-proxy SNATs to it.
    nodes = sorted({p.node for p in pods if p.node})
    sources += [Endpoint(f"{n}'s own IP", net.pod_subnets[0].broadcast_address - 20 - i, "node", node=n)
                for i, n in enumerate(nodes)]
    # The collector has an ENI in each subnet it is given; any of them may scrape.
    sources += [Endpoint(f"AMP managed collector ENI in {s}", s.broadcast_address - 4, "scraper")
                for s in net.scraper_subnets]
    hub = hub_imports if hub_imports is not None else hub_models(plan)
    cluster = Cluster([o for o in objects if o["kind"] == "NetworkPolicy"], pods, services)
    pools = {o["metadata"]["labels"][INSTANCE]: tuple(o["metadata"]["annotations"][POOL_MEMBERS_ANNOTATION].split(","))
             for o in objects if o["kind"] == "Deployment"
             and POOL_MEMBERS_ANNOTATION in (o["metadata"].get("annotations") or {})}
    return Stack(name, cluster, sources, api, dns, by_model, exposed, hub, snat, from_zero, pools)


# ---------------------------------------------------------------------------------------------
# The flows, written once: (must, sources, destinations, port, why). Sets and ports are
# resolved per model by `members()` and `ports()`; an empty set checks nothing.

FLOWS = (
    ("allow", "routers", "api-server", "https", "SMG watches its model's pods (kube-client's in-cluster config "
                                                "dials KUBERNETES_SERVICE_HOST, the `kubernetes` ClusterIP)"),
    ("deny", "routers", "not-the-api", "https", "a router's one 443 peer is the `kubernetes` ClusterIP: not the "
                                               "API's ENIs dialled directly, no other VPC address or ClusterIP, "
                                               "nothing public"),
    ("allow", "routers", "vllm", "http", "the router forwards requests to its model's pods"),
    ("allow", "routers", "dns", "dns", "name lookups"),
    ("allow", "actuators", "vllm", "http", "the standby actuator reads, wakes and sleeps its model's engines"),
    ("allow", "actuators", "api-server", "https", "the standby actuator lists its model's pods"),
    ("deny", "actuators", "not-the-api", "https", "the actuator's one 443 peer is the `kubernetes` ClusterIP"),
    ("allow", "actuators", "dns", "dns", "name lookups"),
    ("allow", "scrapers", "vllm", "metrics", "autoscaling reads vLLM's queue from its /metrics"),
    ("allow", "scrapers", "scraped-routers", "metrics", "a router's `metrics` port is declared to be scraped"),
    ("allow", "vllm", "dns", "dns", "name lookups"),
    ("allow", "vllm", "s3", "https", "the weights stream from S3"),
    ("allow", "vllm", "sts", "https", "IRSA's AssumeRoleWithWebIdentity"),
    ("allow", "imports", "dns", "dns", "name lookups"),
    ("allow", "imports", "s3", "https", "the import writes the model's bucket"),
    ("allow", "imports", "sts", "https", "IRSA's AssumeRoleWithWebIdentity"),
    ("allow", "hub-imports", "hub", "https", "a Hub import downloads from huggingface.co"),
    ("allow", "staging", "dns", "dns", "name lookups"),
    ("allow", "staging", "s3", "https", "the node cache copies from S3"),
    ("allow", "staging", "sts", "https", "IRSA's AssumeRoleWithWebIdentity"),
    ("allow", "staging", "api-server", "https", "the staging pods write NodeFeatures"),
    ("allow", "clients", "model-service", "http", "pods of the model's namespace call its Service"),
    ("allow", "vpc-client", "exposed-routers", "http", "an internal load balancer's clients reach the router"),
    ("deny", "all-but-routers", "routed-vllm", "http", "only the routers (and a standby model's actuator, for "
                                                       "the sleep routes) reach a routed model's pods (load bound)"),
    ("deny", "all-but-actuators", "standby-vllm", "http", "vLLM's dev routes (sleep, wake, /collective_rpc) are "
                                                          "reached by the routers and the actuator only, no client"),
    ("allow", "keda-operator", "actuators", "figure", "KEDA's operator reads the standby actuator's pods figure "
                                                      "(the ScaledObject's standby-pods trigger)"),
    ("deny", "keda-operator", "actuators", "any", "KEDA's operator reaches the actuator on the figure's port alone"),
    ("deny", "all-but-keda-operator", "actuators", "figure", "the figure is KEDA's operator's alone to read"),
    ("deny", "all-but-keda-operator", "actuators", "any", "the standby actuator accepts nothing else"),
    ("allow", "keda-operator", "from-zero-routers", "http", "KEDA's operator reads each router pod's front queue "
                                                             "(held requests) to scale its model from zero pods"),
    ("deny", "keda-operator", "other-routers", "http", "KEDA reaches a router only to read a front queue it "
                                                      "scales from"),
    ("deny", "outsiders", "unexposed-from-zero-routers", "http", "the front queue admits KEDA's operator alone from outside "
                                                      "the namespace, not KEDA's other pods"),
    ("deny", "outsiders", "vllm", "http", "no foreign namespace or VPC address calls vLLM directly"),
    ("deny", "everyone", "imports", "any", "the import Job accepts nothing"),
    # The agent admits a node's own IP on every port of the pods on it, both ways: hostNetwork pods
    # (kube-proxy, aws-node) and whatever kube-proxy SNATs on a vLLM pod's node reach all of its
    # ports, its serving port included. Nothing warmstart renders SNATs onto a GPU node.
    ("allow", "own-node", "vllm", "any", "the agent always admits the node's own IP (what that exposes)"),
    # An internal NLB's clients reach the routers only on the serving port, judged on their own
    # address: through a NodePort with SNAT they would arrive as the router's node's IP, which the
    # agent admits on every port, whatever clientCidrs say.
    ("deny", "lb-clients-as-seen", "exposed-routers", "any", "load-balancer clients keep their address"),
    ("deny", "everyone", "warm-spares", "any", "warm-spare placeholders accept nothing"),
    # A named Prometheus is admitted by its pods, so every other pod is kept off the metrics
    # ports. The managed collector scrapes from ENIs in the VPC's subnets, which no CIDR tells apart
    # from pods: its metrics-only ports are open to the VPC by design (never a serving port).
    ("deny", "non-scrapers", "scraped-routers", "metrics", "only the named scraper reads the router's metrics"),
    ("deny", "non-scrapers", "vllm", "metrics", "only the named scraper reads vLLM's metrics-only port"),
)


def flow_id(row) -> str:
    return f"{row[1]} -> {row[2]} ({row[3]})"


def _metrics_port(pod: Endpoint) -> str:
    """vLLM serves /metrics on its API port unless a `metrics` port is declared."""
    return "metrics" if pod.listening("metrics") is not None else "http"


def members(stack: Stack, name: str, model: str | None) -> list[Endpoint | Service]:
    of = lambda role: [e for e in stack.sources if e.role == role and e.model == model]  # noqa: E731
    routers, vllm, actuators = of("router"), of("vllm"), of("actuator")
    actuators += [e for e in stack.sources if e.role == "pool-actuator"
                  and model in stack.pool_members.get(e.labels.get(INSTANCE, ""), ())]
    scrapers = [e for e in stack.sources if e.role == "scraper"]
    # scrapers read vLLM's `http` port when it serves the metrics too
    metrics_on_http = any(_metrics_port(v) == "http" for v in vllm)
    # The nodes' own IPs are admitted everywhere on their node by the agent itself (the "own-node"
    # row says what that exposes); every other row is about pods and clients.
    others = [e for e in stack.sources if e.role != "node"]
    sets = {
        "routers": routers, "vllm": vllm, "imports": of("import"), "staging": of("staging"),
        "actuators": actuators, "standby-vllm": vllm if actuators else [],
        "all-but-actuators": [e for e in others if e not in actuators and e not in routers
                              and not (e.role == "scraper" and metrics_on_http)],
        "routed-vllm": vllm if routers else [],
        "keda-operator": [e for e in stack.sources if e.role == "keda-operator"],
        "all-but-keda-operator": [e for e in others if e.role != "keda-operator"],
        "from-zero-routers": routers if model in stack.from_zero else [],
        # (an exposed router admits the VPC's addresses on its serving port, pods among them)
        "other-routers": routers if model not in stack.from_zero and model not in stack.exposed else [],
        "unexposed-from-zero-routers": routers if model in stack.from_zero and model not in stack.exposed else [],
        "scraped-routers": [r for r in routers if r.listening("metrics") is not None],
        "hub-imports": of("import") if model in stack.hub_imports else [],
        "exposed-routers": routers if model in stack.exposed else [],
        "warm-spares": [e for e in stack.sources if e.role == "warm-spare"],
        "scrapers": scrapers, "everyone": others,
        "non-scrapers": [e for e in others if e.role != "scraper"]
        if scrapers and all(s.namespace is not None for s in scrapers) else [],
        "all-but-routers": [e for e in others
                            if e not in routers and e not in actuators and not (e.role == "scraper" and metrics_on_http)],
        "outsiders": [e for e in stack.sources if e.role in ("foreign", "vpc-client")],
        "clients": [e for e in stack.sources if e.role == "client" and any(v.namespace == e.namespace for v in vllm)],
        "vpc-client": [e for e in stack.sources if e.role == "vpc-client"],
        "own-node": [e for e in stack.sources if e.role == "node" and any(e.node == v.node for v in vllm)],
        # As the router sees an NLB client: itself, or (SNAT) the IP of the node the router runs on.
        "lb-clients-as-seen": ([e for e in stack.sources if e.role == "node" and any(e.node == r.node for r in routers)]
                               if model in stack.snat_exposed else
                               [e for e in stack.sources if e.role == "vpc-client"]) if model in stack.exposed else [],
        "model-service": [stack.services[model]] if model in stack.services and vllm else [],
        "api-server": [stack.api], "dns": [stack.dns],
        "not-the-api": [*(Endpoint(f"{b.name}, dialled directly", b.ip, "api-eni") for b in stack.api.backends),
                        Endpoint("another ClusterIP of the Service range", stack.api.cluster_ip + 1, "service-range"),
                        *(e for e in stack.sources if e.role == "vpc-client"),
                        Endpoint("S3 (gateway endpoint)", S3_IP, "s3"), Endpoint("huggingface.co", HUB_IP, "hub")],
        "s3": [Endpoint("S3 (gateway endpoint)", S3_IP, "s3")], "sts": [Endpoint("STS", STS_IP, "sts")],
        "hub": [Endpoint("huggingface.co", HUB_IP, "hub")],
    }
    return sets[name]


def ports(key: str, dst: Endpoint | Service) -> list[tuple[int | str, str]]:
    if key == "dns":
        return [(53, "UDP"), (53, "TCP")]
    if key == "https":
        return [(443, "TCP")]
    if key == "any":  # the destinations declare no port; any one stands for all
        return [(8080, "TCP")]
    if key == "metrics" and isinstance(dst, Endpoint) and dst.role == "vllm":
        return [(_metrics_port(dst), "TCP")]
    return [(key, "TCP")]


@dataclass(frozen=True)
class Violation:
    stack: str
    flow: str
    must: str
    source: str
    destination: str
    port: str
    why: str

    def __str__(self) -> str:
        return (f"{self.stack}: must {self.must} [{self.flow}] {self.source} -> {self.destination} on "
                f"{self.port}: {self.why or 'it is allowed'}")


def check(stack: Stack, rows: Sequence[tuple[str, str, str, str, str]] = FLOWS) -> list[Violation]:
    """Every flow of `rows` the stack gets wrong."""
    out: dict[str, Violation] = {}
    for must, srcs, dsts, key, _ in rows:
        for model in stack.models or [None]:
            for dst in members(stack, dsts, model):
                for src in members(stack, srcs, model):
                    if src is dst:
                        continue
                    for port, proto in ports(key, dst):
                        why = stack.cluster.reach(src, dst, port, proto)
                        if (must == "allow") == bool(why):
                            name = dst.name if isinstance(dst, Endpoint) else f"Service {dst.namespace}/{dst.name}"
                            v = Violation(stack.name, flow_id((must, srcs, dsts, key)), must, src.name, name,
                                          f"{port}/{proto}", why)
                            out[str(v)] = v
    return list(out.values())
