"""One model on a cluster warmstart did not create: a `ServedModel` from a `PlatformArgs` alone.

What you give: your cluster's facts (its OIDC provider for IRSA, its VPC blocks and Service
range for the NetworkPolicies, its Karpenter NodePools, the bucket a relative `source` is in)
and one model entry, written as in a warmstart stack's `models[]`. What ServedModel creates:
the model's IRSA role, its Deployment, Service and NetworkPolicies, the image pre-pull on its
pool, its pod-side scripts (this platform ships none), and a router in front of its replicas.
Nothing cluster-wide is touched.
"""

import pulumi
from warmstart_components import ClusterMode, PlatformArgs, ServedModel

cfg = pulumi.Config()
facts = cfg.require_object("platform")
platform: PlatformArgs = {
    **facts,
    "stack": pulumi.get_stack(),
    "region": cfg.require("region"),
    "cluster_mode": ClusterMode(facts["cluster_mode"]),
    "kubeconfig": cfg.require_secret("kubeconfig"),
}
model = ServedModel(f"research-{cfg.require_object('model')['name']}",
                    {"model": cfg.require_object("model"), "platform": platform})
pulumi.export("endpoint", model.endpoint)
pulumi.export("roleArn", model.role_arn)
pulumi.export("tensorParallelSize", model.plan.tensor_parallel_size)
