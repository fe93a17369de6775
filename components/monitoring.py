"""What autoscaling on vLLM's metrics needs once per stack: a place the metrics land, something
that scrapes them, and KEDA.

- An Amazon Managed Service for Prometheus workspace and a managed collector (`aws.amp.Scraper`)
  that scrapes every vLLM pod's `/metrics` (and every router's, when routing exists) in the
  given namespaces, nothing else; or, instead, an existing Prometheus-compatible endpoint the
  user names (then no workspace, no collector, and KEDA queries it without SigV4).
- KEDA from its official chart, pinned (`versions.KEDA_CHART_VERSION`), on non-GPU nodes, its
  operator's IRSA role allowed exactly the AMP query actions on that one workspace.

The collector's access to the cluster: the cluster authenticates with EKS access entries
(`authenticationMode: API`), and for such clusters AMP creates the collector's access entry
itself when the scraper is created ("Configure Amazon EKS for scraper access with access
entries", https://docs.aws.amazon.com/prometheus/latest/userguide/AMP-collector-how-to.html#AMP-collector-eks-setup);
EKS keeps one access entry per principal, so a second one from here would fail the `up`: this
component creates none (`scraperAccessEntry: true` is refused).
"""

from typing import NotRequired, Optional, TypedDict

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from warmstart import versions
from warmstart.config import KedaConfig, MonitoringConfig
from warmstart.decisions import autoscaling as decide
from warmstart.decisions import iam
from warmstart.errors import ConfigError
from warmstart.manifests import autoscaling as objects

from .enums import ClusterMode, mode_value
from .model_args_gen import camel_case
from .platform import PlatformMonitoringArgs
from .providers import kubernetes_provider
from .section_args import MonitoringSectionArgs
from .sections import nested_section

KEDA_POLICY_NAME = "amp-query"
# The managed collector tags its destination workspace with this key; declaring it keeps
# `pulumi up` from removing it again (pulumi-aws `aws.amp.Scraper`, "Ignoring changes to
# Prometheus Workspace destination").
SCRAPER_WORKSPACE_TAG = "AMPAgentlessScraper"


class MonitoringArgs(TypedDict):
    """Inputs of the Monitoring component."""

    cluster_name: str
    """Name of the EKS cluster (the access entry's cluster, and the prefix of the collector's alias)."""
    cluster_mode: ClusterMode
    """How the cluster runs nodes; KEDA lands on its elastic `general-purpose` NodePool (Auto Mode's
    built-in one, or warmstart's own in Karpenter mode), never on a GPU node."""
    region: str
    """AWS region of the cluster and the workspace (KEDA signs its queries for it)."""
    name_prefix: str
    """Prefix of the names: `<namePrefix>-keda-operator` (IAM role), `<namePrefix>-metrics` (workspace alias)."""
    oidc_provider_arn: pulumi.Input[str]
    """ARN of the cluster's IAM OIDC provider (the KEDA operator role's Federated principal)."""
    oidc_issuer: pulumi.Input[str]
    """The cluster's OIDC issuer, with or without `https://` (the trust conditions' key prefix)."""
    namespaces: list[str]
    """Namespaces whose vLLM (and router) pods are scraped; pods anywhere else are not."""
    router: NotRequired[bool]
    """Also scrape the routers' `metrics` port (default false: no routing)."""
    monitoring: NotRequired[MonitoringSectionArgs]
    """The stack's `monitoring` section, as a stack config writes it: `prometheusUrl` (an existing
    Prometheus-compatible endpoint, its base URL without `/api/v1/query`, that already scrapes the
    pods; then no workspace, no collector and no AWS identity for KEDA), `scraper` (that
    Prometheus's pods, which the models' NetworkPolicies admit: the `platformMonitoring` this
    component gives Python programs carries them) and `keda` (KEDA's namespace and operator, and
    whether the component installs it). Its validation and defaults are the config's. Deprecated,
    still read: `prometheusUrl` at the top of the Args."""
    cluster_arn: NotRequired[pulumi.Input[str]]
    """ARN of the EKS cluster the collector scrapes; required unless `monitoring.prometheusUrl` is
    given."""
    subnet_ids: NotRequired[pulumi.Input[list[str]]]
    """The cluster's subnets (at least two AZs), where the collector puts its network interfaces;
    required unless `monitoring.prometheusUrl` is given."""
    security_group_ids: NotRequired[pulumi.Input[list[str]]]
    """Security groups of the collector's network interfaces: the cluster's, so it reaches the pods."""
    scraper_access_entry: NotRequired[bool]
    """Refused when true: AMP creates the collector's access entry itself on every cluster that
    uses access entries (`API` or `API_AND_CONFIG_MAP`), and a second entry for the same
    principal fails; a cluster without access entries cannot take one at all."""
    kubeconfig: NotRequired[pulumi.Input[str]]
    """Kubeconfig of the cluster; without it the Kubernetes objects use the provider of the
    resource options (or the ambient one)."""
    tags: NotRequired[dict[str, str]]
    """Tags on the workspace, the collector and the IAM role."""


class Monitoring(pulumi.ComponentResource):
    """Metrics collection for autoscaling (AMP workspace + managed collector, or an existing
    endpoint) and KEDA on non-GPU nodes."""

    server_address: pulumi.Output[str]
    """What every ScaledObject's prometheus trigger queries (`serverAddress`, no trailing slash)."""
    sigv4_region: pulumi.Output[str]
    """Region KEDA signs its queries for (the AMP path); empty for an existing endpoint."""
    workspace_arn: pulumi.Output[str]
    """ARN of the AMP workspace; empty for an existing endpoint."""
    keda_operator_role_arn: pulumi.Output[str]
    """ARN of the KEDA operator's IRSA role; empty for an existing endpoint."""

    def __init__(self, name: str, args: MonitoringArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__("warmstart:index:Monitoring", name, None, opts)
        if args.get("scraper_access_entry"):
            raise ConfigError("MonitoringArgs.scraperAccessEntry", "AMP creates the collector's EKS access entry "
                              "itself when the cluster uses access entries (API or API_AND_CONFIG_MAP), and EKS keeps "
                              "one entry per principal, so a second one always fails the `up` "
                              "(https://docs.aws.amazon.com/prometheus/latest/userguide/AMP-collector-how-to.html)",
                              "remove scraperAccessEntry", True)
        mode = mode_value(args["cluster_mode"])
        if mode not in ("auto", "karpenter"):
            raise ConfigError("MonitoringArgs.clusterMode", "must be auto or karpenter", "use ClusterMode", mode)
        namespaces = sorted(set(args["namespaces"]))
        if not namespaces:
            raise ConfigError("MonitoringArgs.namespaces", "names no namespace, so nothing would be scraped",
                              "list the namespaces of the models that autoscale")
        tags = dict(args.get("tags") or {})
        # The monitoring section, read back through the config model it is generated from (no
        # field of it is declared here).
        section, where = nested_section(MonitoringConfig, args, "monitoring", "MonitoringArgs", self)
        keda = section.keda
        child = pulumi.ResourceOptions(parent=self)
        k8s_opts = child
        if args.get("kubeconfig") is not None:
            provider = kubernetes_provider(name, args["kubeconfig"], child)
            k8s_opts = pulumi.ResourceOptions(parent=self, provider=provider)

        url = section.prometheus_url
        role_arn: Optional[pulumi.Output[str]] = None
        if url is not None:
            try:
                address = objects.server_address(url)
            except ValueError as err:
                raise ConfigError(f"{where}.prometheusUrl", str(err), "give the server's base URL, e.g. "
                                  "http://prometheus-operated.monitoring.svc:9090", url) from None
            self.server_address = pulumi.Output.from_input(address)
            self.sigv4_region = pulumi.Output.from_input("")
            self.workspace_arn = pulumi.Output.from_input("")
        else:
            missing = [k for k in ("cluster_arn", "subnet_ids", "security_group_ids") if args.get(k) is None]
            if missing:
                raise ConfigError(f"MonitoringArgs.{camel_case(missing[0])}", "the managed collector needs the "
                                  "cluster's ARN, subnets and security groups", "give them, or "
                                  "monitoring.prometheusUrl for an existing endpoint")
            role_arn = self._amp(name, args, namespaces, tags, child, k8s_opts, keda)
        self.keda_operator_role_arn = role_arn if role_arn is not None else pulumi.Output.from_input("")
        self.platform_monitoring: PlatformMonitoringArgs = _platform_monitoring(
            self.server_address, args["region"], section)
        """What this monitoring gives a platform's models (`PlatformArgs.monitoring`, Python
        programs): the endpoint KEDA queries, who scrapes the pods, where KEDA runs."""

        self.keda: Optional[k8s.helm.v3.Release] = None
        """The KEDA release: every ScaledObject must depend on it (it serves the CRDs); None when
        KEDA is the user's (`keda.create: false`)."""
        if not keda.create:
            self.register_outputs({"serverAddress": self.server_address, "sigv4Region": self.sigv4_region,
                                   "workspaceArn": self.workspace_arn, "kedaOperatorRoleArn": self.keda_operator_role_arn})
            return
        ns = k8s.core.v1.Namespace(
            f"{name}-keda-ns", metadata={"name": keda.namespace, "labels": {
                # Every KEDA pod runs non-root, read-only, capabilities dropped, RuntimeDefault
                # seccomp (the chart's values below), which is the restricted Pod Security level.
                "pod-security.kubernetes.io/enforce": "restricted",
                "app.kubernetes.io/part-of": "warmstart", "app.kubernetes.io/managed-by": "pulumi"}},
            opts=k8s_opts)
        self.keda = k8s.helm.v3.Release(
            f"{name}-keda", name="keda", chart=versions.KEDA_CHART, version=versions.KEDA_CHART_VERSION,
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=versions.KEDA_CHART_REPO),
            namespace=keda.namespace,
            values=objects.keda_values(mode, role_arn, service_account=keda.operator_service_account),
            opts=pulumi.ResourceOptions.merge(k8s_opts, pulumi.ResourceOptions(depends_on=[ns])))
        self.register_outputs({"serverAddress": self.server_address, "sigv4Region": self.sigv4_region,
                               "workspaceArn": self.workspace_arn, "kedaOperatorRoleArn": self.keda_operator_role_arn})

    def _amp(self, name: str, args: MonitoringArgs, namespaces: list[str], tags: dict[str, str],
             child: pulumi.ResourceOptions, k8s_opts: pulumi.ResourceOptions, keda: KedaConfig) -> pulumi.Output[str]:
        """Workspace, collector and the KEDA operator's role; returns the role's ARN, resolved once
        its policy is attached."""
        prefix, region = args["name_prefix"], args["region"]
        workspace = aws.amp.Workspace(
            f"{name}-workspace", alias=f"{prefix}-metrics",
            tags=tags | {"Name": f"{prefix}-metrics", SCRAPER_WORKSPACE_TAG: ""}, opts=child)
        scraper = aws.amp.Scraper(
            f"{name}-scraper", alias=f"{args['cluster_name']}-vllm"[:100],
            source={"eks": {"cluster_arn": args["cluster_arn"],
                            "subnet_ids": pulumi.Output.from_input(args["subnet_ids"]).apply(sorted),
                            "security_group_ids": pulumi.Output.from_input(args["security_group_ids"]).apply(sorted)}},
            destination={"amp": {"workspace_arn": workspace.arn}},
            scrape_configuration=objects.scrape_configuration_yaml(namespaces, router=bool(args.get("router"))),
            tags=tags, opts=child)
        # The KEDA operator's role: IRSA for exactly its ServiceAccount (warmstart's KEDA's, or
        # the user's), query actions on this one workspace.
        role_name = decide.keda_operator_role_name(prefix)
        subject_ns, subject_sa = keda.namespace, keda.operator_service_account
        trust = pulumi.Output.all(args["oidc_provider_arn"], args["oidc_issuer"]).apply(
            lambda v: iam.to_json(iam.irsa_trust_policy(v[0], v[1].removeprefix("https://"), subject_ns, subject_sa)))
        role = aws.iam.Role(
            f"{name}-keda-operator", name=role_name, assume_role_policy=trust,
            description=f"warmstart: {subject_ns}/{subject_sa} queries the {prefix}-metrics workspace",
            tags=tags | {"Name": role_name}, opts=child)
        policy = aws.iam.RolePolicy(
            f"{name}-keda-operator-amp", role=role.name, name=KEDA_POLICY_NAME,
            policy=workspace.arn.apply(lambda arn: iam.to_json(decide.keda_query_policy(arn))), opts=child)
        self.server_address = workspace.prometheus_endpoint.apply(objects.server_address)
        self.sigv4_region = pulumi.Output.from_input(region)
        self.workspace_arn = workspace.arn
        self.workspace = workspace
        self.scraper = scraper
        return pulumi.Output.all(role.arn, policy.id).apply(lambda v: v[0])


def _platform_monitoring(server_address: pulumi.Output[str], region: str,
                         section: MonitoringConfig) -> PlatformMonitoringArgs:
    """The platform facts of a monitoring section: KEDA signs its queries for the region on the
    managed path only; the managed collector scrapes unless the section names an endpoint of its
    own, whose Prometheus pods (`scraper`) the models then admit."""
    managed = section.prometheus_url is None
    return {"server_address": server_address, **({"region": region} if managed else {}), "managed_scraper": managed,
            "scraper_pods": [{"namespace": section.scraper.namespace, "pod_labels": dict(section.scraper.pod_labels)}]
            if section.scraper is not None else [],
            "keda_namespace": section.keda.namespace}
