"""One model served by vLLM on an existing EKS cluster, with the VllmModel component alone.

What you give: the cluster's kubeconfig, the model's S3 source and size, the instance type its
nodes have, and optionally its IRSA role and a compile-cache bucket. What VllmModel decides
itself: tensor parallel degree, streamer concurrency and distributed loading, pod size, probes
and start-up budget, the NVMe start-up check and the compile-cache wiring.
"""

import pulumi
from warmstart_components import ClusterMode, VllmModel, VllmModelArgs

cfg = pulumi.Config()
model = VllmModel("qwen", VllmModelArgs(
    # The model as a stack's `models[]` entry writes it (ModelEntryArgs); no `pool`: any node
    # of the instance type.
    model={
        "name": "qwen-67b",
        "source": cfg.require("source"),
        "weights_gib": cfg.require_float("weightsGiB"),
        "instance_type": cfg.require("instanceType"),
    },
    region=cfg.require("region"),
    namespace=cfg.get("namespace") or "default",
    cluster_mode=ClusterMode(cfg.get("clusterMode") or "auto"),
    kubeconfig=cfg.require_secret("kubeconfig"),
    role_arn=cfg.require("roleArn"),
    compile_cache_bucket=cfg.require("compileCacheBucket"),
))
pulumi.export("endpoint", model.endpoint)
pulumi.export("tensorParallelSize", model.plan.tensor_parallel_size)
