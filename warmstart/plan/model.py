"""One model's decisions (pure; no Pulumi): the VllmModel component's planner.

`plan_model` decides everything for one model from its own spec and where it runs, and raises
ConfigErrors naming each broken rule under the key it is given.
"""

from __future__ import annotations

import posixpath

from ..config import S3_URI, LoaderTuning, ModelSpec
from ..decisions import autoscaling as scaling
from ..decisions import instances, placement, routing, tuning
from ..decisions import standby as standby_mod
from ..decisions import standby_pool as pool_mod
from ..decisions import node_cache as staging
from ..decisions import weights_import as imports
from ..decisions.instances import GIB
from ..errors import ConfigError, Problems
from .records import ModelPlan, ServingPlan

__all__ = ["MANAGED_FLAGS", "ModelPlan", "ServingPlan", "check_compile_cache_host_path", "compile_cache_host_path",
           "plan_import", "plan_model"]

# Flags warmstart derives; a model's extraArgs may not set them, or two sources of truth
# would disagree on the cluster.
MANAGED_FLAGS = (
    "--tensor-parallel-size",
    "--load-format",
    "--model-loader-extra-config",
    "--enforce-eager",
    "--max-model-len",
    "--gpu-memory-utilization",
    "--port",
    "--host",
    standby_mod.SLEEP_MODE_FLAG,
)


def compile_cache_host_path(mode: placement.ClusterMode, host_path: str | None = None) -> str:
    """The node directory of the compile cache: `host_path` as given, or the mode's NVMe mount."""
    return posixpath.normpath(host_path or placement.compile_cache_host_path(mode))


def check_compile_cache_host_path(host_path: str | None, mode: placement.ClusterMode, key: str) -> None:
    """A given cache path must lie under the mode's NVMe mount, or the cache silently lands on
    the root EBS volume (https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html#model-loading-nvme-instance-store)."""
    mount = placement.NVME_MOUNT[mode]
    if host_path is not None and not placement.under(host_path, mount):
        raise ConfigError(
            key, f"is not under {mount}, where clusterMode: {mode} mounts the node's NVMe: the cache "
            "would silently land on the root EBS volume", f"use a path under {mount}/ or remove it "
            "for the default", host_path)


def plan_import(m: ModelSpec, weights_bytes: int, *, key: str, cluster_mode: placement.ClusterMode,
                non_gpu: placement.NonGpuPlacement = placement.ANYWHERE_OFF_GPU) -> imports.ImportPlan | None:
    """The weights-import Job of a model with `import`, or ConfigErrors keyed `<key>.s3` /
    `<key>.huggingFace` (`key`: the import's own key, e.g. `warmstart:models[0].import`)."""
    w = m.weights_import
    if w is None:
        return None
    problems = Problems()
    source_bucket = source_prefix = revision = None
    if w.s3 is not None:
        match = S3_URI.match(w.s3)
        assert match is not None  # the config model validated it
        source_bucket, source_prefix = match["bucket"], match["prefix"].rstrip("/")
        source: str = f"s3://{source_bucket}/{source_prefix}"
        kind: imports.ImportKind = "s3"
        scratch = 0
        if imports.overlaps(source_bucket, source_prefix, m.bucket, m.prefix):
            problems.add(
                f"{key}.s3", f"{m.name}: the import source overlaps the model's own source "
                f"{m.source}: the copy would read the keys it writes", "import from the prefix that holds "
                "the weights now, or remove `import` if they are already in source", w.s3)
    else:
        assert w.hugging_face is not None  # the config model requires exactly one
        source, revision, kind = f"hf://{w.hugging_face.repo}", w.hugging_face.revision, "huggingFace"
        # Streamed file by file: the scratch holds the files in flight, never the model, so no
        # Hub model is refused for its size (decisions/weights_import.py SCRATCH_CAP_BYTES).
        scratch = imports.scratch_bytes(weights_bytes)
    problems.raise_if_any()
    digest = imports.import_digest(source, revision, m.source)
    return imports.ImportPlan(
        model=m.name, kind=kind, source=source, revision=revision, destination=m.source,
        dest_bucket=m.bucket, dest_prefix=m.prefix, source_bucket=source_bucket, source_prefix=source_prefix,
        weights_bytes=weights_bytes, job_name=imports.job_name(m.name, digest),
        service_account=imports.service_account(m.name), deadline_seconds=imports.deadline_seconds(weights_bytes),
        scratch_bytes=scratch, cpu=imports.import_cpu(kind, weights_bytes), non_gpu=non_gpu)


def plan_model(m: ModelSpec, *, key: str, instance_type: str, pool: str | None, loader: LoaderTuning,
               compile_cache: bool, compile_cache_host_path: str,
               cluster_mode: placement.ClusterMode = "auto", import_key: str | None = None,
               node_cache: staging.NodeCacheMode = "off", autoscaled: bool = False,
               non_gpu: placement.NonGpuPlacement = placement.ANYWHERE_OFF_GPU) -> ModelPlan:
    """Every decision for one model on one instance type, or ConfigErrors keyed under `key`
    (`warmstart:models[0]` for a stack's model, `VllmModelArgs` for the component alone).
    `cluster_mode` decides where a weights-import Job runs; its errors are keyed under
    `import_key` (default `<key>.import`). `node_cache`: auto, on or off (a stack model's
    `nodeCache`; the VllmModel component alone stages nothing). `autoscaled`: an autoscaler the
    model's spec does not carry owns the replica count (the VllmModel component alone). `non_gpu`:
    where the platform's non-GPU pods (the import Job) go."""
    problems = Problems()
    try:
        inst = instances.lookup(instance_type)
    except instances.UnknownInstanceType as err:
        raise ConfigError(f"{key}.instanceType", "unknown GPU instance type",
                          f"use one of: {', '.join(err.known)}", instance_type) from None

    weights = int(m.weights_gib * GIB)
    requested = None if m.tensor_parallel_size == "auto" else m.tensor_parallel_size
    try:
        tp = tuning.choose_tensor_parallel(weights, inst, requested, m.gpu_memory_utilization)
    except tuning.TuningError as err:
        raise ConfigError(f"{key}.tensorParallelSize", f"{m.name}: {err.rule}", err.fix,
                          m.tensor_parallel_size) from None

    distributed = tp > 1
    if m.eager and distributed:
        problems.add(
            f"{key}.eager", f"{m.name}: --enforce-eager breaks distributed loading, which "
            f"tensorParallelSize={tp} turns on (an error, or a silent fallback to rank 0 loading and "
            "an NCCL broadcast)", "set eager: false, or use a model that fits on one GPU", True)
    if m.eager and compile_cache:
        problems.add(
            f"{key}.compileCache", f"{m.name}: --enforce-eager disables torch.compile, so the "
            "compile cache would never be written", "set compileCache: false or eager: false", True)
    for arg in m.extra_args:
        flag = arg.split("=", 1)[0]
        if flag in MANAGED_FLAGS:
            problems.add(
                f"{key}.extraArgs", f"{flag} is derived by warmstart", "remove it and set the "
                "matching model key (tensorParallelSize, eager, maxModelLen, gpuMemoryUtilization)", arg)
    weights_import = None
    with problems.collect():
        weights_import = plan_import(m, weights, key=import_key or f"{key}.import", cluster_mode=cluster_mode,
                                     non_gpu=non_gpu)
    replicas = m.replicas
    if m.autoscaling is not None:
        a = m.autoscaling
        spec = scaling.AutoscalingSpec(a.min_replicas, a.max_replicas, a.target_waiting_per_replica,
                                       a.kv_cache_usage_ceiling,
                                       target_requests_per_replica=a.target_requests_per_replica)
        explicit = "replicas" in m.model_fields_set
        with problems.collect():
            # A front queue in the router holds requests while no engine is awake, so minReplicas: 0
            # (zero awake with the sleepers kept, or zero pods) drops nothing; it needs a router.
            routed = routing.wanted(m.routing.policy, m.replicas, a.max_replicas + standby_engines(m))
            scaling.check_spec(spec, key=f"{key}.autoscaling", model=m.name, front_queue=routed,
                               replicas=m.replicas if explicit else None, replicas_key=f"{key}.replicas")
        with problems.collect():
            scaling.check_pool_can_grow(pool, key=f"{key}.autoscaling", model=m.name)
        # The count of the first create; KEDA owns it from then on.
        replicas = m.replicas if explicit else scaling.initial_replicas(spec)
    standby = pooled = None
    with problems.collect():
        standby = plan_standby(m, weights, inst, tp, key=f"{key}.standby", autoscaled=autoscaled)
        pooled = plan_pooled(m)
    if standby is not None and m.autoscaling is not None and "replicas" not in m.model_fields_set:
        # The first create starts the sleepers too.
        replicas += standby.count
    load = digest = None
    try:
        load = staging.predict(inst, weights, node_cache)
        if load.staged:
            digest = staging.model_version_digest(
                m.source, import_source=weights_import.source if weights_import else None,
                import_revision=weights_import.revision if weights_import else None)
    except staging.NodeCacheError as err:
        problems.add(f"{key}.nodeCache", f"{m.name}: {err.rule}", err.fix, node_cache)
    problems.raise_if_any()

    return ModelPlan(
        name=m.name,
        source=m.source,
        bucket=m.bucket,
        prefix=m.prefix,
        pool=pool,
        instance=inst,
        tensor_parallel_size=tp,
        weights_bytes=weights,
        loader=loader,
        concurrency=tuning.loader_concurrency(weights, loader.chunk_bytes),
        distributed=distributed,
        eager=m.eager,
        compile_cache=compile_cache,
        compile_cache_host_path=compile_cache_host_path,
        startup_budget_seconds=tuning.startup_budget_seconds(weights),
        pod=tuning.pod_size(inst, tp),
        replicas=replicas,
        image=m.image,
        max_model_len=m.max_model_len,
        gpu_memory_utilization=m.gpu_memory_utilization,
        extra_args=tuple(m.extra_args),
        weights_import=weights_import,
        routing=m.routing,
        autoscaling=m.autoscaling,
        load=load,
        weights_digest=digest,
        priority_class_name=m.priority_class_name,
        standby=standby,
        pooled=pooled,
        node_cache_content_check=m.node_cache_content_check,
    )


def standby_engines(m: ModelSpec) -> int:
    """Engines the model's router may have beside `maxReplicas` of its own pods: its sleepers, or
    with pooled standby the one engine woken for it on a host."""
    if m.standby is None:
        return 0
    return 1 if m.standby.pool is not None else m.standby.count


def plan_pooled(m: ModelSpec) -> pool_mod.PooledStandby | None:
    """The model's part of a standby pool (`standby.pool`), or None: its port and idle time. The
    pool itself is planned with all its members (plan/standby_pool.py)."""
    s = m.standby
    if s is None or s.pool is None:
        return None
    return pool_mod.PooledStandby(pool=s.pool, port=pool_mod.member_port(m.name, s.port),
                                  awake_idle_seconds=s.awake_idle_seconds, port_given=s.port is not None)


def plan_standby(m: ModelSpec, weights_bytes: int, inst: instances.GpuInstance, tp: int, *, key: str,
                 autoscaled: bool = False) -> standby_mod.StandbyPlan | None:
    """The model's standby engines, or ConfigErrors keyed `<key>.<field>` (`key`:
    `warmstart:models[0].standby`). None for no standby, and for pooled standby (`standby.pool`),
    whose sleepers are the pool's: its rules here are what a member alone breaks."""
    s = m.standby
    if s is None:
        return None
    problems = Problems()
    if s.pool is not None:
        for field, name in (("count", "count"), ("sleep_level", "sleepLevel")):
            if field in s.model_fields_set:
                problems.add(f"{key}.{name}", f"{m.name}: names standby pool '{s.pool}' and sets {name}; a pooled "
                             f"model keeps no sleepers of its own (the pool's spare hosts hold its engine, at the "
                             "pool's sleepLevel)", f"remove {name} (per-model standby), or remove pool",
                             getattr(s, field))
    elif s.port is not None:
        problems.add(f"{key}.port", f"{m.name}: a standby port is a pooled model's (its engine's port on the pool's "
                     "hosts), and the model names no pool", "remove port, or add `pool: <standbyPools name>`", s.port)
    if m.autoscaling is None and not autoscaled:
        problems.add(key, f"{m.name}: standby engines are pods KEDA keeps beside the awake ones, and the model "
                     "has no autoscaling", "add autoscaling (minReplicas, maxReplicas), or remove standby", s.count)
    if m.routing.policy == "none":
        # Without a router the model's Service and its NetworkPolicy admit every pod of the
        # namespace to vLLM's port, and standby turns on vLLM's dev routes there (/sleep,
        # /wake_up, /collective_rpc; VLLM_SERVER_DEV_MODE): only the router keeps a sleeper out
        # of the traffic (its worker selector) and the dev routes away from clients.
        problems.add(f"{key.removesuffix('.standby')}.routing.policy",
                     f"{m.name}: standby engines need the model's router (it sends only to awake engines, and "
                     "only it and the standby actuator may reach vLLM's sleep and wake routes), and routing is none",
                     "set routing.policy: auto (or a named policy), or remove standby", m.routing.policy)
    if s.pool is not None:
        # The host's memory is the pool's rule (standby_pool.choose_sleep_level), not the model's pod's.
        problems.raise_if_any()
        return None
    pod = tuning.pod_size(inst, tp)
    rule = standby_mod.check_host_memory(weights_bytes=weights_bytes, sleep_level=s.sleep_level,
                                         pod_memory_bytes=pod.memory_bytes, shm_bytes=pod.shm_bytes)
    if rule is not None:
        problems.add(f"{key}.sleepLevel", f"{m.name}: {rule} on {inst.instance_type} ({inst.memory_gib} GiB of RAM "
                     f"for {inst.gpu_count} GPUs, tensorParallelSize={tp})",
                     "set sleepLevel: 2 (the weights are dropped and reloaded on wake), or use an instance type "
                     "with more RAM per GPU", s.sleep_level)
    problems.raise_if_any()
    return standby_mod.plan_standby(count=s.count, sleep_level=s.sleep_level,
                                    awake_idle_seconds=s.awake_idle_seconds, weights_bytes=weights_bytes)
