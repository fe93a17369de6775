# Generated from warmstart.config.ModelConfig by components/model_args_gen.py: do not edit.
# Regenerate with `python -m tests.golden` (tests/served_model/test_model_args.py fails while stale).
"""One `models[]` entry of a stack as Args: every field of `warmstart.config.ModelConfig`, key for
key, for the components that take a model entry (validate one with
`components.model_entry.model_config`)."""

from typing import NotRequired, TypedDict


class ModelEntryLoaderArgs(TypedDict):
    """Run:ai Model Streamer tuning, as AWS recommends in [Accelerate model loading on Amazon
    EKS](https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html)."""

    chunk_bytes: NotRequired[int]
    """Bytes per ranged S3 read (`RUNAI_STREAMER_CHUNK_BYTESIZE`). 4 GiB is about one request per
    safetensors shard; larger than a shard was 56 % slower. Default: `4294967296`."""
    request_timeout_ms: NotRequired[int]
    """Low-speed window after which a stalled connection is cut and its part retried
    (`RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS`; the S3 client rounds it down to whole seconds, at
    least 3). Default: `10000`."""
    low_speed_limit_bytes_per_second: NotRequired[int]
    """Throughput below which a connection counts as stalled (`RUNAI_STREAMER_S3_LOW_SPEED_LIMIT`).
    Keep it far below a healthy connection's rate: a load whose connections all stay under it for
    longer than the retry window fails. Default: `65536`."""
    retry_window_seconds: NotRequired[int]
    """How long after its first request a chunk whose transfer failed (a stall cut the S3 client
    gave up retrying, a 5xx, a throttle) is requested again (`RUNAI_STREAMER_S3_TIMEOUT`, read by
    runai-model-streamer 0.16 and later). 0: never; the first such failure fails the whole load
    and vLLM exits. Default: `300`."""


class ModelEntryHuggingFaceArgs(TypedDict):
    """A Hugging Face Hub repository at a pinned commit."""

    repo: str
    """Repository id, e.g. `meta-llama/Llama-3.1-8B-Instruct`."""
    revision: str
    """The commit (40 hex characters) to copy: a branch or tag could move under the same config."""


class ModelEntryWeightsImportArgs(TypedDict):
    """Where `up` copies the model's weights from into `source`, once, before its pods start."""

    hugging_face: NotRequired[ModelEntryHuggingFaceArgs]
    """From the Hugging Face Hub. A gated repository needs the secret `warmstart:huggingFaceToken`."""
    s3: NotRequired[str]
    """From another `s3://bucket/prefix`, which the import's role may read."""


class ModelEntryRoutingArgs(TypedDict):
    """How requests reach the model's replicas: a router (SMG, https://github.com/smg-project/smg)
    in front of the vLLM pods, behind the model's one Service (see docs/routing.md)."""

    policy: NotRequired[str]
    """`prefix_hash`: the same prompt prefix goes to the same replica, which then reuses its prefix
    cache, unless that replica is over the load bound (consistent hashing with bounded loads).
    `round_robin`: plain load balancing. `none`: no router; the Service spreads requests over the
    pods at random. `auto`: `prefix_hash` when the model can have more than one replica
    (`replicas > 1` or `autoscaling.maxReplicas > 1`), else `none`. One of `auto`, `prefix_hash`,
    `round_robin`, `none`. Default: `auto`."""
    load_factor: NotRequired[float]
    """Load bound, relative: a replica with more requests in flight than this multiple of the
    replicas' mean (and more than `maxExcessRequests` over it) is skipped for the least-loaded
    one. Default: `1.25`."""
    max_excess_requests: NotRequired[int]
    """Load bound, absolute: requests in flight a replica may carry over the mean, across the whole
    fleet, before it is skipped (each of the two routers applies its share). Below SMG's 10,
    which left one replica in seven up to 17 % off the mean share in warmstart's benchmark
    (docs/routing.md). Default: `4`."""
    internal_load_balancer: NotRequired[bool]
    """Also expose the router through an internal Network Load Balancer (reachable from the VPC
    only), for clients outside the cluster. Default: `false`."""


class ModelEntryAutoscalingArgs(TypedDict):
    """Replicas scaled by KEDA on vLLM's own metrics, queried from Prometheus (Amazon Managed
    Service for Prometheus by default)."""

    min_replicas: NotRequired[int]
    """Fewest serving pods (awake engines). 0 needs a router: a front queue in it holds the requests
    that arrive until an engine serves (429 with Retry-After past its bounds). With `standby`
    engines 0 keeps only the sleepers and a held request wakes one; without, 0 is zero pods (the
    GPU released) and KEDA scales from zero on the front queues' held requests. Default: `1`."""
    max_replicas: int
    """Most serving pods; the GPU pool's limit must hold them plus one surge pod."""
    target_waiting_per_replica: NotRequired[float]
    """Requests waiting in vLLM's queue per replica (`vllm:num_requests_waiting`) above which a
    replica is added. Default: `5`."""
    kv_cache_usage_ceiling: NotRequired[float]
    """Also scale up when any replica's KV cache is fuller than this fraction
    (`vllm:kv_cache_usage_perc`). Default: not used."""
    target_requests_per_replica: NotRequired[float]
    """Requests one engine carries, running plus waiting (`vllm:num_requests_running` +
    `vllm:num_requests_waiting`): KEDA keeps ceil(total / this) engines awake, plus the standby
    sleepers, so a load the engines carry without a queue is not scaled away. Set it to the
    running requests one engine holds at your latency target. Default: `32`."""


class ModelEntryStandbyArgs(TypedDict):
    """Engines kept started and asleep beside the awake ones, woken in seconds when the load rises
    (vLLM sleep mode; see docs/scale-out.md). Needs `autoscaling`: KEDA owns how many pods exist,
    awake plus standby."""

    count: NotRequired[int]
    """Engines kept asleep. Each holds its GPUs while asleep (it costs what an awake replica costs);
    what it saves is the cold start of a scale-out. Default: `1`."""
    sleep_level: NotRequired[int]
    """vLLM's sleep level. 1: the weights move to host RAM (the pod's memory must hold them) and
    waking copies them back (about 3 s per 64 GiB). 2: the weights are dropped and reloaded from
    their source on wake (slower; for an instance whose RAM cannot hold them). Default: `1`."""
    awake_idle_seconds: NotRequired[int]
    """How long an awake engine must have had no request running or waiting before it may be put
    back to sleep (only while fewer than `count` engines sleep). An engine the load does not need
    (more awake than `minReplicas` and the engines its requests need at
    `targetRequestsPerReplica`) sleeps sooner, its requests drained first (docs/scale-out.md).
    Default: `300`."""
    pool: NotRequired[str]
    """Name of a `standbyPools` entry: the model's engine sleeps on the pool's spare engine hosts,
    which it shares with the pool's other models, instead of on sleepers of its own (see
    docs/scale-out.md, "Pooled standby"). `count` and `sleepLevel` are then the pool's and may
    not be given. Default: per-model standby."""
    port: NotRequired[int]
    """With `pool`: the port the model's vLLM serves on, in its own pods and on the pool's hosts
    (its routers reach both on one port), unique in the pool. It never changes when another model
    joins or leaves the pool. Default: derived from the model's name (8100-8999); set it only
    when two members' derived ports collide (the render says so)."""


class ModelEntryArgs(TypedDict):
    """One served model: one vLLM Deployment. A stack's `models[]` entry
    (`warmstart.config.ModelConfig`), key for key; its validation and defaults are that model's."""

    name: str
    """Deployment, Service and ServiceAccount name (a DNS label, at most 40 characters)."""
    source: str
    """Where the weights are: a key prefix in the stack's model bucket
    (`meta-llama/Llama-3.1-8B-Instruct`, no scheme), or `s3://bucket/prefix` in full. Either way
    the safetensors shards plus config and tokenizer files sit directly under the prefix (the
    streamer does not list recursively)."""
    weights_gib: float
    """Total size of the safetensors weights in GiB (2^30 bytes). In a stack file the key is
    `weightsGiB`."""
    instance_type: NotRequired[str]
    """Instance type within the pool; default: the pool's only instance type."""
    tensor_parallel_size: NotRequired[int]
    """GPUs per replica. `auto`: the fewest of 1, 2, 4, 8 that hold the weights and leave 15 % of
    each GPU for KV cache. Omit the key for `auto` (the schema has no unions). Default: `auto`."""
    replicas: NotRequired[int]
    """Number of serving pods. Default: `1`."""
    image: NotRequired[str]
    """vLLM container image (>= 0.11.1 for distributed loading); pin by `@sha256:` digest. Default:
    `vllm/vllm-openai:v0.33.0`."""
    max_model_len: NotRequired[int]
    """`--max-model-len`; bounds KV memory and start-up profiling. Default: the model's. At most
    16,777,216 (2^24). vLLM refuses one above the model's own `max_position_embeddings` (times
    its RoPE scaling factor, `--hf-overrides` included) when the engine starts; a model with
    `import` is checked against its `config.json` by the import Job, before any copy."""
    gpu_memory_utilization: NotRequired[float]
    """`--gpu-memory-utilization`; also the basis of the tensor-parallel rule. Default: `0.9`."""
    eager: NotRequired[bool]
    """Run with `--enforce-eager`: no torch.compile or CUDA graphs (faster start, 5-30 % lower
    throughput). Incompatible with distributed loading and with the compile cache. Default:
    `false`."""
    compile_cache: NotRequired[bool]
    """Use the compile cache. Default: the stack's `compileCache.enabled`, off for eager models."""
    extra_args: NotRequired[list[str]]
    """Extra `vllm serve` arguments, appended after the ones warmstart manages. Default: `[]`."""
    loader: NotRequired[ModelEntryLoaderArgs]
    """Per-model override of the stack's `loader`."""
    weights_import: NotRequired[ModelEntryWeightsImportArgs]
    """Copy the weights into `source` during `up` (a Job on non-GPU nodes), verified and recorded in
    a manifest; without it `source` must already hold them. In a stack file the key is `import`."""
    routing: NotRequired[ModelEntryRoutingArgs]
    """The router in front of the replicas (see `RoutingConfig`). Default: every key at its default."""
    autoscaling: NotRequired[ModelEntryAutoscalingArgs]
    """Scale the replicas on vLLM's metrics; `replicas` is then only the first `up`'s count.
    Default: a fixed `replicas`."""
    standby: NotRequired[ModelEntryStandbyArgs]
    """Keep engines started and asleep, woken in seconds on load (see `StandbyConfig`). Default:
    none; a scale-out starts a new pod."""
    priority_class_name: NotRequired[str]
    """PriorityClass of the serving pods (an existing one), e.g. so they preempt batch work on a
    shared pool; not a `system-*` class (kube-system only) nor warmstart's own `warmstart-*` (the
    node cache's, ranked below every serving pod). Default: the cluster's default."""
    node_cache: NotRequired[str]
    """Stage the weights on each GPU node's NVMe ahead of time (a DaemonSet that also pulls the
    model's image there), so pods on those nodes load them locally and pods elsewhere stream from
    S3 (see docs/node-cache.md). `auto`: where the plan predicts a load from NVMe that saves at
    least 10 s and a quarter of tuned streaming from S3 on the model's instance type. One of
    `auto`, `on`, `off`. Default: `auto`."""
    node_cache_content_check: NotRequired[str]
    """How a staged copy's bytes are checked against what S3 vouches for (see docs/node-cache.md).
    `auto`: per file the import manifest's sha256, else S3's `ChecksumSHA256`, else the ETag
    where S3 computed it from the bytes (unencrypted or SSE-S3); a file none applies to (SSE-KMS
    without a sha256) is kept on its size, named in the stager's log. `etag`: as auto, but such a
    file refuses the copy. `sha256`: every file by a sha256, else refused. `size`: sizes and
    ETags only. A refused copy stays on the node and is not copied again. One of `auto`, `etag`,
    `sha256`, `size`. Default: `auto`."""
    pool: str
    """Name of the `gpuPools` entry the model runs on."""


__all__ = [
    "ModelEntryArgs",
    "ModelEntryAutoscalingArgs",
    "ModelEntryHuggingFaceArgs",
    "ModelEntryLoaderArgs",
    "ModelEntryRoutingArgs",
    "ModelEntryStandbyArgs",
    "ModelEntryWeightsImportArgs",
]
