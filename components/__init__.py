"""warmstart's reusable Pulumi components: vLLM on Amazon EKS with fast cold starts.

Each component takes its own typed Args (a TypedDict a person writes, with plain values for
plan-time decisions and `pulumi.Input` for values wired from other resources), decides inside
through warmstart's pure planners, and registers only resources:

- `Network`: a VPC (or an existing one) with the S3 Gateway endpoint on every private route table;
- `Cluster`: EKS in Auto Mode or with self-managed Karpenter, GPU pools on RAID0 NVMe;
- `ModelStorage`: the model and compile-cache buckets with a security baseline;
- `ModelRole`: one model's least-privilege IRSA role;
- `ModelImportRole`: the separate role of a model's weights-import Job (writes its prefix only);
- `VllmModel`: one model served by vLLM, tuned for a fast cold start;
- `ModelRouter`: an SMG router in front of a model's replicas (prefix-aware, with a load bound);
- `Monitoring`: metrics for autoscaling (managed Prometheus and its collector) and KEDA;
- `ModelAutoscaling`: one model's KEDA ScaledObject on vLLM's own metrics;
- `ModelStandby`: one model's standby actuator, which wakes a sleeping vLLM engine on load and
  puts the idlest back to sleep (docs/scale-out.md);
- `ServingPlatform`: what a cluster's models share (namespace, pod-side scripts, node cache,
  warm spares, image cache); its output is a `PlatformArgs`, the one handle a model takes;
- `ServedModel`: one `models[]` entry on a platform (its roles, VllmModel, router, autoscaling):
  the package's main component;
- `WarmstartStack`: all of them from one stack config (what `__main__.py` deploys);
- `ModelStack`: one ServedModel on an existing WarmstartStack, through its exported PlatformArgs.

Network, Cluster and ModelStorage take their sections of the stack config nested, as the
`*SectionArgs` generated from the config models (components/section_args.py), as ServedModel
takes a `models[]` entry (components/model_args.py): each field is declared once, in
warmstart/config.py.

All but the last two are also a source-based Pulumi component package (`PulumiPlugin.yaml`,
`__main__.py` here), so `pulumi package add` makes them usable from TypeScript, Go, C# or YAML.
Modules import each other relatively, so the package works under any name it is imported as
(`components` in this project, `warmstart_components` once installed).
"""

from .autoscaling import ModelAutoscaling, ModelAutoscalingArgs
from .cluster import Cluster, ClusterArgs, GpuPoolArgs, PoolModelArgs, SystemNodeGroupArgs
from .section_args import (CapacityBlockSectionArgs, CapacityReservationSectionArgs, ClusterSectionArgs,
                           CompileCacheBucketSectionArgs, GpuPoolSectionArgs, ModelBucketSectionArgs, NetworkSectionArgs,
                           PoolCapacitySectionArgs, SystemNodeGroupSectionArgs)
from .identity import ModelImportRole, ModelImportRoleArgs, ModelRole, ModelRoleArgs
from .model_stack import KUBECONFIG_OUTPUT, PLATFORM_OUTPUT, ModelStack, ModelStackArgs, is_model_stack, model_stack_config
from .monitoring import Monitoring, MonitoringArgs
from .network import Network, NetworkArgs
from .platform import (NonGpuPlacementArgs, PlatformArgs, PlatformCompileCacheArgs, PlatformMonitoringArgs,
                       PlatformPoolArgs, ServingPlatform, ServingPlatformArgs, TolerationArgs)
from .served_model import ServedModel, ServedModelArgs
from .routing import ModelRouter, ModelRouterArgs, RoutingPolicy
from .serving import HuggingFaceSourceArgs, LoaderArgs, VllmModel, VllmModelArgs, WeightsImportArgs
from .standby import ModelStandby, ModelStandbyArgs
from .stack import WarmstartStack, WarmstartStackArgs, stack_config
from .storage import CompileCacheBucketArgs, ModelBucketArgs, ModelStorage, ModelStorageArgs
from .enums import ClusterMode, NvmeCheckMode

__all__ = [
    "KUBECONFIG_OUTPUT", "PLATFORM_OUTPUT", "Cluster", "ClusterArgs", "ClusterMode", "CompileCacheBucketArgs", "GpuPoolArgs", "HuggingFaceSourceArgs",
    "LoaderArgs", "ModelAutoscaling", "ModelStack", "ModelStackArgs", "ModelAutoscalingArgs", "ModelBucketArgs", "ModelImportRole", "ModelImportRoleArgs", "ModelRole", "ModelRoleArgs", "ModelRouter", "ModelRouterArgs",
    "ModelStandby", "ModelStandbyArgs", "ModelStorage", "ModelStorageArgs", "Monitoring", "MonitoringArgs", "Network", "NetworkArgs", "NonGpuPlacementArgs", "NvmeCheckMode",
    "PlatformArgs", "PlatformCompileCacheArgs", "PlatformMonitoringArgs", "PlatformPoolArgs", "PoolModelArgs", "RoutingPolicy",
    "ServedModel", "ServedModelArgs", "ServingPlatform", "ServingPlatformArgs", "SystemNodeGroupArgs", "TolerationArgs", "VllmModel", "VllmModelArgs", "WarmstartStack", "WarmstartStackArgs",
    "WeightsImportArgs", "is_model_stack", "model_stack_config", "stack_config",
    "CapacityBlockSectionArgs", "CapacityReservationSectionArgs", "ClusterSectionArgs", "CompileCacheBucketSectionArgs",
    "GpuPoolSectionArgs", "ModelBucketSectionArgs", "NetworkSectionArgs", "PoolCapacitySectionArgs",
    "SystemNodeGroupSectionArgs",
]
