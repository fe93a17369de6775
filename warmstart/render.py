"""`warmstart render`: run the real Pulumi program under Pulumi mocks and write what it declares.

No cloud, no Pulumi CLI: the program is the project's own `__main__.py`, run by the harness in
`mocks.py`, which stands in for the engine and the providers deterministically, so two renders
are byte-identical.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from . import config as config_mod
from . import mocks
from .plan import stack as plan_mod
from .plan import platform as platform_mod
from .plan import aws as plan_aws
from .decisions import autoscaling as scaling
from .decisions import capacity, gpu_pools, image_cache, phases, prices, routing
from .decisions import weights_import as imports
from .decisions import standby_pool as standby_pool_mod
from .errors import ConfigError
from .mocks import Registered

AnyPlan = plan_mod.StackPlan | platform_mod.ModelStackPlan


@dataclass
class Rendered:
    """What a stack declares."""

    stack_plan: AnyPlan
    resources: list[Registered]
    outputs: dict[str, Any] = field(default_factory=dict)
    """The program's exports, resolved (a platform's contract for its model stacks)."""

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


def load_plan(stacks_dir: Path, stack: str, program_dir: Path | None = None) -> tuple[dict[str, str], AnyPlan]:
    """Read, validate and plan a stack file; ConfigError(s) on any broken rule. A model stack is
    planned against its platform's contract, taken from the platform stack's own render."""
    raw = config_mod.read_stack_file(config_mod.stack_file(stacks_dir, stack))
    if not config_mod.is_model_stack(raw):
        return raw, plan_mod.plan_stack(config_mod.from_pulumi_config(raw), stack)
    cfg = config_mod.model_stack_from_pulumi_config(raw)
    platform_mod.check_sibling_model_stacks(cfg, stack, sibling_model_stacks(stacks_dir))
    outputs = platform_outputs(stacks_dir, cfg.platform, stack, program_dir)
    contract = platform_mod.parse(outputs.get(platform_mod.OUTPUT), cfg.platform, stack)
    return raw, platform_mod.plan_model_stack(cfg, contract, stack)


def sibling_model_stacks(stacks_dir: Path) -> dict[str, tuple[str, str]]:
    """{stack: (platform, model name)} of every model stack file in `stacks_dir` (a file that
    does not parse is skipped here: its own render reports it)."""
    out: dict[str, tuple[str, str]] = {}
    for path in sorted(stacks_dir.glob("Pulumi.*.yaml")):
        try:
            raw = config_mod.read_stack_file(path)
            if not config_mod.is_model_stack(raw):
                continue
            model = json.loads(raw.get(platform_mod.MODEL_KEY, "{}"))
        except (ConfigError, ValueError):
            continue
        if isinstance(model, dict) and isinstance(model.get("name"), str):
            out[path.name.removeprefix("Pulumi.").removesuffix(".yaml")] = (str(raw[config_mod.PLATFORM_KEY]),
                                                                            model["name"])
    return out


_PLATFORMS: dict[tuple[Path, str], dict[str, Any]] = {}


def platform_outputs(stacks_dir: Path, platform: str, model_stack: str,
                     program_dir: Path | None = None) -> dict[str, Any]:
    """A platform stack's outputs from its own offline render (no cloud): what a model stack's
    StackReference reads. Rendered once per folder and platform."""
    key = (stacks_dir.resolve(), platform)
    if key not in _PLATFORMS:
        name = platform.rsplit("/", 1)[-1]
        path = config_mod.stack_file(stacks_dir, name)
        if not path.is_file():
            raise ConfigError(f"{config_mod.PLATFORM_KEY}", f"model stack {model_stack!r} names platform stack "
                              f"{platform!r}, which has no stack file {path.name} to render offline",
                              f"create stacks/{path.name}, or name an existing environment stack", platform)
        if config_mod.is_model_stack(config_mod.read_stack_file(path)):
            raise ConfigError(f"{config_mod.PLATFORM_KEY}", f"model stack {model_stack!r} names {platform!r}, "
                              "which is a model stack itself, not an environment", "name the environment stack",
                              platform)
        _PLATFORMS[key] = run_program(stacks_dir, name, program_dir).outputs
    return _PLATFORMS[key]


def run_program(stacks_dir: Path, stack: str, program_dir: Path | None = None,
                olds: Iterable[str] = ()) -> Rendered:
    """Validate the stack config, then run the Pulumi program (`program_dir/__main__.py`, by
    default the project that holds `stacks_dir`) under the mocks; `olds`: the URNs of a state
    the run upgrades, matched by the resources' aliases as the engine matches them."""
    raw, stack_plan = load_plan(stacks_dir, stack, program_dir)
    program_dir = stacks_dir.parent if program_dir is None else program_dir
    others = {}
    if isinstance(stack_plan, platform_mod.ModelStackPlan):
        others = {stack_plan.config.platform: platform_outputs(stacks_dir, stack_plan.config.platform, stack,
                                                               program_dir)}
        region = stack_plan.contract.region
    else:
        region = stack_plan.config.region
    outputs: dict[str, Any] = {}
    resources = mocks.run_program_file(program_dir, region=region, stack=stack, config=raw, stack_outputs=others,
                                       exports=outputs, olds=olds)
    return Rendered(stack_plan, resources, outputs)


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


# A built pod script rides in a ConfigMap as one base64 line of up to ~200 kB, and PyYAML's pure
# Python emitter walks a scalar character by character twice (Emitter.analyze_scalar, then
# write_plain): most of a render's YAML time. Such a string has no space, break or indicator
# character, so when it also resolves to a plain str (yaml.resolver.BaseResolver.resolve: a
# long run of digits would be an int, and quoted) the emitter writes it verbatim as a plain
# scalar on one line, exactly as it writes a short plain stand-in in the same place. So the
# stand-in is dumped and swapped for the blob: the same bytes, without the walk. libyaml's
# CSafeDumper is no way out: it folds long double-quoted scalars elsewhere than PyYAML does
# (a node's userData), so the files would change.
_BLOB = re.compile(r"[A-Za-z0-9+/]{256,}={0,2}")
_STR_TAG = "tag:yaml.org,2002:str"
_RESOLVER = yaml.resolver.Resolver()


def _stand_in_blobs(node: Any, blobs: dict[str, str]) -> Any:
    if isinstance(node, dict):
        return {k: _stand_in_blobs(v, blobs) for k, v in node.items()}
    if isinstance(node, list):
        return [_stand_in_blobs(v, blobs) for v in node]
    if (isinstance(node, str) and _BLOB.fullmatch(node)
            and _RESOLVER.resolve(yaml.ScalarNode, node, (True, False)) == _STR_TAG):
        token = f"warmstartblob{len(blobs)}z"
        blobs[token] = node
        return token
    return node


def object_yaml(obj: dict[str, Any]) -> str:
    head = {k: obj[k] for k in ("apiVersion", "kind", "metadata") if k in obj}
    rest = {k: v for k, v in obj.items() if k not in head}
    doc = {k: _ordered(v) for k, v in head.items()} | _ordered(rest)
    blobs: dict[str, str] = {}
    text = yaml.safe_dump(_stand_in_blobs(doc, blobs), sort_keys=False, default_flow_style=False, width=100)
    if any(text.count(token) != 1 for token in blobs):  # a stand-in's text elsewhere in the object
        return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100)
    for token, blob in blobs.items():
        text = text.replace(token, blob)
    return text


def object_filename(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    rank = _APPLY_RANK.get(obj["kind"], 5)
    parts = [str(rank), obj["kind"].lower(), meta.get("namespace"), meta.get("name", "unnamed")]
    return "-".join(p for p in parts if p) + ".yaml"


REDACTED = "<redacted: a secret, deployed from the stack's encrypted config>"


def redacted(obj: dict[str, Any]) -> dict[str, Any]:
    """A Secret's values never reach the render's files (a Hugging Face token, say)."""
    if obj.get("kind") != "Secret":
        return obj
    return obj | {k: {name: REDACTED for name in obj[k]} for k in ("data", "stringData") if isinstance(obj.get(k), dict)}


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
        (out / "kubernetes" / object_filename(obj)).write_text(object_yaml(redacted(obj)))
    cloud = [{"type": r.typ, "name": r.name, "inputs": r.inputs} for r in rendered.cloud_resources]
    (out / "cloud.json").write_text(json.dumps(cloud, indent=2, sort_keys=True) + "\n")
    (out / "plan.json").write_text(json.dumps(rendered.stack_plan.summary(), indent=2, sort_keys=True) + "\n")


def _scale_out(m: plan_mod.ModelPlan, weights: str) -> scaling.ScaleOutEstimate:
    # SOCI parallel pull: built into Auto Mode's GPU nodes, `FastImagePull` on warmstart's
    # Karpenter nodes (https://aws.amazon.com/blogs/containers/introducing-seekable-oci-parallel-pull-mode-for-amazon-eks/).
    start = phases.predict_cold_start(m.weights_bytes, m.instance, new_node=True, compile_cached=m.compile_cache,
                                      image_present=False, parallel_pull=True,
                                      weights_source=weights)  # type: ignore[arg-type]
    # Engine init and graph capture as their own steps, cached exactly when the compile is (the
    # startup plan and the JIT caches travel with it), each with its own source.
    engine, graphs = phases.engine_init_prediction(m.compile_cache), phases.cuda_graph_prediction(m.compile_cache)
    return scaling.scale_out_estimate(
        node_launch_s=start.node_launch, node_launch_source=phases.ASSUMPTION,
        image_s=start.image_pull, image_source=phases.SOCI_BLOG,
        weights_s=start.weights, weights_source=phases.EKS_GUIDE if weights == "s3" else phases.HYPERPOD,
        compile_s=start.pod_start + start.process_start + start.compile, compile_source=phases.BLOG,
        engine=(scaling.Phase("engine init", start.engine_init, engine.basis),
                scaling.Phase("CUDA graphs", start.cuda_graphs, graphs.basis)))


def _pool_of(stack_plan: AnyPlan, m: plan_mod.ModelPlan) -> Any:
    cluster = getattr(stack_plan, "cluster", None)
    return next((p for p in cluster.pools if p.name == m.pool), None) if cluster else None


def _pool_model(m: plan_mod.ModelPlan) -> gpu_pools.PoolModel:
    return gpu_pools.PoolModel(m.instance, m.tensor_parallel_size, m.replicas, name=m.name)


def _sleepers(m: plan_mod.ModelPlan) -> int:
    """Standby engines: pods that hold their GPUs around the clock, asleep."""
    return m.standby.count if m.standby else 0


def _running_nodes(stack_plan: AnyPlan, pool: Any) -> int:
    """Nodes a pool runs with every model at its fewest replicas, its sleepers and the spares included."""
    return sum(gpu_pools.nodes_for(_pool_model(m), (m.autoscaling.min_replicas if m.autoscaling else m.replicas)
                                   + _sleepers(m))
               for m in stack_plan.models if m.pool == pool.name) + pool.warm_nodes


def replicas_cell(m: plan_mod.ModelPlan) -> str:
    """The replicas column: KEDA's awake range, and the sleepers kept beside it (`1-3 +2 asleep`)."""
    a = m.autoscaling
    awake = f"{a.min_replicas}-{a.max_replicas} (KEDA)" if a else str(m.replicas)
    return f"{awake} +{_sleepers(m)} asleep" if _sleepers(m) else awake


def node_price(pool: Any) -> str:
    """The pool's price per node-hour of its first-choice capacity (and of the fallback when it differs)."""
    cap = pool.capacity
    prices = [(capacity.LABEL[t], capacity.price_of(t, pool.hourly_price_usd, cap.spot_hourly_price_usd))
              for t in cap.types]
    if len({p for _, p in prices}) == 1:
        return capacity.usd(prices[0][1])
    return " / ".join(f"{capacity.usd(p)} {t}" for t, p in prices)


def model_stack_price(stack_plan: AnyPlan, m: plan_mod.ModelPlan) -> tuple[float | None, str]:
    """A model stack's node-hour: its platform pool's on-demand list price in the platform's
    region (the platform's own hourlyPriceUsd is not in the contract), unknown where the pool
    takes spot first (the engines try reserved, then spot, then on-demand)."""
    pool = next((p for p in stack_plan.contract.pools if p.name == m.pool), None)
    if pool is None:
        return None, "unknown: the platform has no such pool"
    kinds = set(pool.capacity_types)
    if "spot" in kinds and "reserved" not in kinds:
        return None, "unknown: the platform's pool takes spot first, whose price moves"
    listed = prices.pool_price(stack_plan.contract.region, list(pool.instance_types))
    if listed is None:
        return None, (f"unknown: {stack_plan.contract.region} is not in warmstart's price table "
                      "(warmstart/data/ondemand_prices.csv)")
    return listed.usd_per_hour, f"on-demand list price, {listed.as_of}"


def model_cost(stack_plan: AnyPlan, m: plan_mod.ModelPlan) -> str:
    """What a model costs per hour at its min and max replicas, its standby sleepers (which hold
    their GPUs around the clock) and its pool's warm spares included, at the pool's first-choice
    price ("unknown" without a price)."""
    pool = _pool_of(stack_plan, m)
    if pool is None and isinstance(stack_plan, platform_mod.ModelStackPlan):
        price, spares = model_stack_price(stack_plan, m)[0], 0
    elif pool is None:
        return "-"
    else:
        price = capacity.price_of(pool.capacity.types[0], pool.hourly_price_usd, pool.capacity.spot_hourly_price_usd)
        spares = pool.warm_nodes
    if price is None:
        return "unknown"
    lo = (m.autoscaling.min_replicas if m.autoscaling else m.replicas) + _sleepers(m)
    hi = (m.autoscaling.max_replicas if m.autoscaling else m.replicas) + _sleepers(m)
    cost = [(gpu_pools.nodes_for(_pool_model(m), n) + spares) * price for n in (lo, hi)]
    return capacity.usd(cost[0]) if cost[0] == cost[1] else f"{capacity.usd(cost[0])}-{capacity.usd(cost[1])}"


def capacity_source_line(stack_plan: AnyPlan, m: plan_mod.ModelPlan) -> str | None:
    """Which capacity the scale-out's new node comes from, and what a launch beyond a
    reservation's free count falls back to, with its price."""
    pool = _pool_of(stack_plan, m)
    if pool is None:
        return None
    cap = pool.capacity
    k = _running_nodes(stack_plan, pool) + 1
    source, fallback = capacity.node_source(cap.types, k, cap.reserved_nodes)

    def priced(t: str) -> str:
        price = capacity.price_of(t, pool.hourly_price_usd, cap.spot_hourly_price_usd)
        key = "capacity.spotHourlyPriceUsd" if t == "spot" else "hourlyPriceUsd"
        return f"{capacity.LABEL[t]} ({capacity.usd(price)}/node-hour)" if price is not None else \
            f"{capacity.LABEL[t]} (price unknown: set gpuPools[].{key})"

    if source == "none":
        return (f"  its new node (node {k} of pool {pool.name}) has no capacity: the reservations hold "
                f"{cap.reserved_nodes} and the pool allows nothing else, so the pod stays Pending")
    if source == "reserved":
        held = f"it holds {cap.reserved_nodes}" if cap.reserved_nodes is not None else "while it has a free instance"
        where = f"from the pool's reservation (node {k}; {held})"
    elif cap.reserved and cap.reserved_nodes is not None:
        where = (f"beyond the reservation's {cap.reserved_nodes} nodes (it is node {k}), so it falls back to "
                 f"{priced(source)}")
    else:
        where = f"from {priced(source)}"
    then = f", then {priced(fallback)} when that has none" if fallback else ""
    return f"  its new node comes {where}{then}"


def capacity_lines(stack_plan: AnyPlan) -> list[str]:
    """Reservation notes of the pools: Auto Mode's cluster-wide effect, Capacity Block windows,
    placeholder ids."""
    cluster = getattr(stack_plan, "cluster", None)
    if cluster is None:
        return []
    lines = []
    reserving = [p.name for p in cluster.pools if p.capacity.reservation_terms]
    if cluster.mode == "auto" and reserving:
        lines.append(f"warning: pool(s) {', '.join(reserving)} select capacity reservations, so EKS Auto Mode no longer "
                     "launches into open ODCRs for ANY NodeClass of this cluster, only into reservations a NodeClass "
                     "selects (https://docs.aws.amazon.com/eks/latest/userguide/auto-odcr.html)")
    for p in cluster.pools:
        cap = p.capacity
        if cap.capacity_block:
            after = [capacity.LABEL[t] for t in cap.types if t != "reserved"]
            then = f"then the pool launches {', then '.join(after)}" if after else "then the pool launches nothing"
            if cap.capacity_block_ends_at is not None:
                drain, terminate = capacity.capacity_block_times(cap.capacity_block_ends_at)
                who = (f"Karpenter drains them from {drain.isoformat()}, before" if cluster.mode == "karpenter"
                       else "Auto Mode drains them before")
                lines.append(f"capacity block {p.name}: ends {cap.capacity_block_ends_at.isoformat()}; EC2 terminates "
                             f"its instances from {terminate.isoformat()} and {who}; {then}")
            else:
                lines.append(f"capacity block {p.name}: no capacityBlock.endsAt given; EC2 terminates its instances 30 "
                             f"minutes before the block ends and the engine drains them first; {then}")
        if cap.reserved_nodes is not None and p.instances:
            # Reserved capacity is billed whether used or not (an ODCR at the On-Demand rate,
            # https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-capacity-reservations.html; a
            # Capacity Block up front), and the pool's GPU limit caps the nodes it can use.
            per_node = min(i.gpu_count for i in p.instances)
            usable = p.max_gpus // per_node
            if cap.reserved_nodes > usable:
                idle = cap.reserved_nodes - usable
                cost = (f" (${idle * p.hourly_price_usd:,.2f}/h at hourlyPriceUsd)" if p.hourly_price_usd is not None
                        else "")
                lines.append(f"note: pool {p.name}: capacity.reservedNodes {cap.reserved_nodes} is more than the "
                             f"{usable} node(s) its GPU limit lets it run (maxGpus {p.max_gpus} / {per_node} GPU(s) per "
                             f"node), so {idle} reserved node(s) are billed and never used{cost}; fix: raise "
                             f"gpuPools[].maxGpus to {cap.reserved_nodes * per_node}, or reserve fewer nodes")
        for rid in cap.placeholder_ids:
            lines.append(f"note: pool {p.name} selects the placeholder reservation {rid}: replace it with your "
                         "reservation's id (the preflight names it until then)")
    return lines


def scale_out_line(m: plan_mod.ModelPlan, warm_nodes: int = 0, standby_pool: standby_pool_mod.PoolPlan | None = None
                   ) -> str:
    """How long an autoscaled model's scale-out takes until the new replica serves on a new
    node (and on a warm spare, where the pool keeps some), phase by phase, from the sourced
    constants of warmstart/decisions/phases.py. A new node has no staged copy yet, so its pod
    streams from S3; a warm spare has the image and, for a staged model, the weights."""
    cold = _scale_out(m, "s3")
    steps = " + ".join(f"{p.name} {p.seconds:.0f}s" for p in cold.phases)
    spare = ""
    if warm_nodes:
        warm = _scale_out(m, "node-cache" if m.staged else "s3")
        spare = (f"; on one of the pool's {warm_nodes} warm spare node(s) ~{warm.warm_spare_seconds:.0f}s (no node "
                 f"launch or pull{', weights from its NVMe' if m.staged else ''})")
    return (f"scale-out {m.name}: {standby_path(m)}{pooled_path(m, standby_pool)}{from_zero_path(m)}a new replica on a new node serves after ~{cold.cold_seconds:.0f}s "
            f"({steps}; SOCI parallel pull, weights streamed from S3, compile cache "
            f"{'restored from S3' if m.compile_cache else 'off'}){spare}; constants in warmstart/decisions/phases.py"
            f"{front_queue_bounds(m)}")


def front_queue_bounds(m: plan_mod.ModelPlan) -> str:
    """The bounds of the front queue in the routers of a model that holds requests at zero awake
    engines ('' for other models): what a client meets past them, and the memory they fit in."""
    if m.autoscaling is None or m.autoscaling.min_replicas != 0:
        return ""
    return (f"; its routers' front queue holds at most {routing.FRONT_QUEUE_MAX_HELD} requests and "
            f"{routing.FRONT_QUEUE_MAX_HELD_BYTES // 2**20} MiB of bodies (429 with Retry-After past either), "
            f"{routing.FRONT_QUEUE_MAX_CONNECTIONS} open connections, {routing.FRONT_QUEUE_READ_TIMEOUT_SECONDS}s "
            f"for a client to send a request, within {routing.FRONT_QUEUE_MEMORY_LIMIT_MIB} MiB")


def _duration(seconds: int) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{max(1, round(seconds / 60))} min"


def import_line(m: plan_mod.ModelPlan) -> str | None:
    """What the model's weights import will do: its scratch, its node, its predicted time and
    how long `pulumi up` waits for it (decisions/weights_import.py has every figure's source)."""
    imp = m.weights_import
    if imp is None:
        return None
    size = f"{imp.weights_bytes / 2**30:.0f} GiB"
    wait = f"deadline {_duration(imp.deadline_seconds)}, which `pulumi up` waits for before the Deployment"
    if imp.kind == "s3":
        return (f"import {m.name}: {size} from {imp.source}, copied server-side by S3 (no bytes through the pod, no "
                f"scratch), {wait}")
    larger = imp.cpu == imports.LARGE_IMPORT_CPU
    node = ("a 2xlarge or larger general-purpose node (it requests "
            f"{imp.cpu} CPU; baseline {imports.LARGE_NODE_BASELINE_BITS / 1e9:g} Gbit/s)") if larger else \
        f"a general-purpose node (baseline {imports.SMALL_NODE_BASELINE_BITS / 1e9:g} Gbit/s on a large)"
    return (f"import {m.name}: {size} from {imp.source}@{(imp.revision or '')[:12]}, file by file through "
            f"{imp.scratch_bytes / 2**30:.0f} GiB of scratch ({imports.FILE_PARALLELISM} files at once of up to "
            f"{imports.ASSUMED_LARGEST_FILE_BYTES / 2**30:.0f} GiB each; a larger file goes with fewer beside it, one "
            f"over {imports.scratch_budget_bytes(imp.scratch_bytes) / 2**30:.0f} GiB fails the Job naming it), on {node}: "
            f"predicted ~{_duration(imp.predicted_seconds or 0)} once it runs, {wait}")


def standby_path(m: plan_mod.ModelPlan) -> str:
    """The scale-out by waking one of the model's standby engines ('' without standby)."""
    if m.standby is None:
        return ""
    s = phases.predict_standby_start(m.weights_bytes, m.instance, m.standby.sleep_level)
    return (f"a woken standby engine (of {m.standby.count}, sleep level {m.standby.sleep_level}) answers "
            f"~{s.total_seconds:.0f}s after the load rises (standby signal {s.signal:.0f}s + wake {s.wake:.1f}s for "
            f"{m.weights_bytes / 2**30:.0f} GiB + first token {s.first_token:.0f}s + router join {s.join:.0f}s); ")


def pooled_path(m: plan_mod.ModelPlan, pool: standby_pool_mod.PoolPlan | None) -> str:
    """The scale-out by waking the model's engine on a spare host of its standby pool ('' unless pooled)."""
    if m.pooled is None or pool is None:
        return ""
    p = pool.path(m.name)
    return (f"its engine woken on a spare host of standby pool {pool.name} answers ~{p.total_seconds:.1f}s after the "
            f"load rises (signal {p.signal:.0f}s + wake {p.wake:.1f}s for {m.weights_bytes / 2**30:.0f} GiB from "
            f"{p.wake_source} + first token {p.first_token:.0f}s + router join {p.join:.0f}s; while every spare is "
            "taken, a cold start below); ")


def standby_pool_lines(stack_plan: AnyPlan) -> list[str]:
    """Each standby pool once: what its spares hold and cost beside per-model standby of the same
    models, its GPU budget and host memory, and the window a taken spare leaves without one."""
    lines = []
    for pool in getattr(stack_plan, "standby_pools", ()):
        c, g, h = pool.cost, pool.gpu, pool.host
        cost = (f"${c.pool_hourly_usd:,.2f}/h against ${c.per_model_hourly_usd:,.2f}/h (up to "
                f"${c.max_hourly_usd:,.2f}/h for {c.max_gpus} GPU(s) while {pool.max_hosts - pool.spares} "
                "host(s) serve woken engines)"
                if c.pool_hourly_usd is not None and c.per_model_hourly_usd is not None else
                "(set gpuPools[].hourlyPriceUsd to see the cost)")
        lines.append(
            f"standby pool {pool.name}: {pool.spares} spare host(s) of {pool.gpus} GPU(s) on {pool.instance_type} "
            f"(GPU pool {pool.gpu_pool}, at most {pool.max_hosts} hosts) hold {len(pool.engines)} models asleep "
            f"({', '.join(pool.members)}); standby GPUs {c.pool_gpus} against {c.per_model_gpus} for one per-model "
            f"sleeper each, {cost}; sleep level {pool.sleep_level} ({pool.sleep_level_reason}); host memory asleep "
            f"{h.need_bytes / 2**30:.0f} of {h.pod_memory_bytes / 2**30:.0f} GiB; each engine runs at "
            f"--gpu-memory-utilization {g.utilization:.2f} beside {g.engines - 1} sleeper(s) of "
            f"{g.residue_bytes / 2**30:.1f} GiB per GPU ({'measured' if g.residue_measured else 'planning default; measure it with `warmstart wake-bench` and set standbyPools[].sleepingResidueGiB'})")
        r = pool.replacement
        lines.append(
            f"  a taken spare's replacement holds every engine again after ~{r.total_seconds:.0f}s (node launch "
            f"{r.node_launch:.0f}s + image {r.image_pull:.0f}s + pod {r.pod_start:.0f}s + "
            + " + ".join(f"{n} {s:.0f}s" for n, s in r.engines)
            + f", one after another): a second rise inside that window gets a cold start of its model, never a wait; "
            f"the pool actuator owns the hosts' replicas ({pool.spares} spare(s) plus one per woken engine), each "
            "member's KEDA its own pods, the woken engine counted in its figure")
    return lines


def from_zero_path(m: plan_mod.ModelPlan) -> str:
    """The scale-out from zero pods ('' unless the model scales to zero pods, without standby)."""
    if m.standby is not None or m.autoscaling is None or m.autoscaling.min_replicas != 0:
        return ""
    z = phases.predict_from_zero(m.weights_bytes, m.instance, compile_cached=m.compile_cache)
    return (f"from zero pods a held request is answered ~{z.total_seconds:.0f}s after it arrives (KEDA polls the "
            f"front queues {z.signal:.0f}s + a cold start on a new node {z.start.total_seconds:.0f}s + readiness "
            f"{z.join:.0f}s); ")


def uncached_images_note(images: list[str]) -> list[str]:
    """A note for the images the ECR pull-through cache does not serve: its one rule mirrors
    Docker Hub (warmstart.decisions.image_cache), so an image from another registry (nvcr.io,
    ghcr.io, ...) is pulled from there on every node, uncached, with no error to say so."""
    uncached = sorted({i for i in images if f"/{image_cache.DOCKER_HUB_PREFIX}/" not in i})
    if not uncached:
        return []
    registries = sorted({i.split("/", 1)[0] for i in uncached})
    return [f"note: imageCache.ecrPullThrough caches Docker Hub images only; {', '.join(uncached)} "
            f"(from {', '.join(registries)}) is pulled from its own registry on every node, not through the cache; "
            "fix: use the image from Docker Hub, or mirror it into ECR yourself and name that image"]


def yours_notes(stack_plan: plan_mod.StackPlan) -> list[str]:
    """What the stack uses but does not create (the `create: false` switches), and what `up`
    then assumes is there."""
    cfg, notes = stack_plan.config, []
    if not cfg.namespace_create:
        notes.append(f"note: namespaceCreate is false, so namespace {cfg.namespace} must exist before `up` "
                     "(warmstart deploys into it and creates no Namespace)")
    if platform_mod.plan_stages(stack_plan) and not cfg.node_feature_discovery.create:
        notes.append("note: nodeFeatureDiscovery.create is false, so the node cache needs your node-feature-discovery: "
                     "its NodeFeature API on and the weights.warmstart.io label namespace allowed (master.extraLabelNs), "
                     "or no node is labelled and pods load from S3")
    keda = cfg.monitoring.keda
    if platform_mod.plan_runs_autoscaling(stack_plan) and not keda.create:
        amp = "" if cfg.monitoring.prometheus_url else (
            f"; the query role trusts {keda.namespace}/{keda.operator_service_account}: annotate it with "
            "eks.amazonaws.com/role-arn set to the stack's kedaOperatorRoleArn and restart the operator")
        notes.append(f"note: monitoring.keda.create is false, so autoscaling needs your KEDA in namespace "
                     f"{keda.namespace} (the ScaledObjects need its keda.sh/v1alpha1 CRDs before `up`){amp}")
    return notes


def standby_spot_notes(stack_plan: AnyPlan) -> list[str]:
    """A standby model whose pool takes spot first: one interruption takes a sleeper, and what
    brings it back is a whole cold start on a new node, not a wake."""
    notes = []
    for m in stack_plan.models:
        pool = _pool_of(stack_plan, m)
        if not m.standby or pool is None or pool.capacity.types[0] != "spot":
            continue
        cold = _scale_out(m, "s3").cold_seconds
        notes.append(f"note: model {m.name!r} keeps {m.standby.count} standby engine(s) on pool {pool.name}, whose "
                     f"nodes come from spot first: an interruption takes a sleeper (with two minutes' notice), and "
                     f"until its replacement has loaded (~{cold:.0f}s on a new node) a rise waits for a cold start; "
                     "put the model on a pool whose capacity.types are [onDemand] or start with reserved")
    return notes


def lone_router_notes(models: list[plan_mod.ModelPlan]) -> list[str]:
    """A router asked for by name in front of a model that can never have two replicas.

    Allowed, and noted rather than refused: decisions/routing.py keeps a named policy on one
    replica on purpose (the model keeps its router's endpoint, metrics and drain behaviour, so
    scaling down to one replica and back never swaps what the Service points at). It is rarely
    meant, though: the router then only adds a hop and prefix_hash has no replica to choose."""
    notes = []
    for m in models:
        if m.routed and m.max_replicas < 2 and m.autoscaling is None:
            # (autoscaling with maxReplicas 1 is refused by the planner: KEDA could change nothing)
            cap = f"replicas {m.replicas}, no autoscaling"
            notes.append(f"note: model {m.name!r}: routing.policy {m.routing.policy} puts a router in front of a model "
                         f"that can never have two replicas ({cap}), so it only adds a hop; set routing.policy: auto "
                         "to drop it, or let the model have two replicas")
    return notes


def table(stack_plan: AnyPlan) -> str:
    """One row per model: the decisions a reviewer checks first."""
    head = ("model", "instance", "gpus/node", "TP", "weights GiB", "concurrency", "distributed",
            "compile cache", "startup budget", "replicas", "routing", "weights load S3 / NVMe", "node cache",
            "node $/h", "model $/h (min-max)")
    rows = [head]
    for m in stack_plan.models:
        a = m.autoscaling
        rows.append((m.name, m.instance.instance_type, str(m.instance.gpu_count), str(m.tensor_parallel_size),
                     f"{m.weights_bytes / 2**30:.1f}", str(m.concurrency), "yes" if m.distributed else "no",
                     m.compile_cache_host_path if m.compile_cache else "off (eager)" if m.eager else "off",
                     f"{m.startup_budget_seconds}s",
                     replicas_cell(m), m.routing_policy,
                     f"{m.load.s3_seconds:.0f}s / {m.load.nvme_seconds:.0f}s" if m.load else "-",
                     ("staged" if m.staged else "off") + (f" ({m.load.mode})" if m.load else ""),
                     node_price(pool) if (pool := _pool_of(stack_plan, m)) is not None else
                     capacity.usd(model_stack_price(stack_plan, m)[0])
                     if isinstance(stack_plan, platform_mod.ModelStackPlan) else "-",
                     model_cost(stack_plan, m)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if isinstance(stack_plan, platform_mod.ModelStackPlan):
        m = stack_plan.model
        lines.append(f"model stack {stack_plan.stack!r} on platform {stack_plan.config.platform!r} "
                     f"(contract v{platform_mod.CONTRACT_VERSION}, {stack_plan.contract.cluster_mode} mode, namespace "
                     f"{stack_plan.contract.namespace}, pool {m.pool})")
        if (line := import_line(m)) is not None:
            lines.append(line)
        if m.autoscaling is not None:
            lines.append(scale_out_line(m))
        price, source = model_stack_price(stack_plan, m)
        lines.append(f"price {m.pool}: " + (f"${price:,.2f}/node-hour ({source}; the platform's hourlyPriceUsd, "
                                            "if it sets one, is not in its contract)" if price is not None else
                                            f"{source}"))
        if stack_plan.contract.image_cache_account:
            lines.extend(uncached_images_note([m.image]))
        lines += lone_router_notes([m])
        return "\n".join(lines)
    for m in stack_plan.models:
        if m.autoscaling is not None:
            pool = next((p for p in stack_plan.cluster.pools if p.name == m.pool), None)
            standby_pool = next((s for s in getattr(stack_plan, "standby_pools", ())
                                 if m.pooled is not None and s.name == m.pooled.pool), None)
            lines.append(scale_out_line(m, pool.warm_nodes if pool else 0, standby_pool))
            source = capacity_source_line(stack_plan, m)
            if source:
                lines.append(source)
    lines += [line for m in stack_plan.models if (line := import_line(m)) is not None]
    lines += capacity_lines(stack_plan)
    for p in stack_plan.cluster.pools:
        if p.warm_nodes and p.warm_instance is not None:
            cost = p.warm_cost_per_hour
            kept = "its models' images and staged weights" if p.staged_models else "its models' images"
            lines.append(f"warm spares {p.name}: {p.warm_nodes} x {p.warm_instance.instance_type} kept up with {kept}, "
                         + (f"${cost:,.2f}/hour" if cost is not None else
                            f"{p.warm_nodes} node-hours per hour (set gpuPools[].hourlyPriceUsd to see the cost)"))
    lines += standby_pool_lines(stack_plan)
    for p in stack_plan.cluster.pools:
        # Where the $/h columns come from: the stack's hourlyPriceUsd, the shipped list price
        # (warmstart/data/SOURCES.md), or nothing, said so.
        lines.append(f"price {p.name}: " + (f"${p.hourly_price_usd:,.2f}/node-hour ({p.price_source})"
                                            if p.hourly_price_usd is not None else
                                            f"{p.price_source}; set gpuPools[].hourlyPriceUsd"))
    g = stack_plan.cluster.system_node_group
    if g is not None:
        lines.append(f"system nodes: {g.size} x {'/'.join(g.instance_types)} hold the Karpenter controller and CoreDNS "
                     "(cluster.systemNodeGroup.size)")
    cpu, cfg_keda = stack_plan.cluster.cpu_pool, stack_plan.config.monitoring.keda
    if cpu is not None:
        routed = sum(1 for m in stack_plan.models if m.routed)
        what = ([f"{routed} routed model(s)' routers"] if routed else []) + (
            ["KEDA"] if platform_mod.plan_runs_autoscaling(stack_plan) and cfg_keda.create else []) + (
            ["node-feature-discovery"] if platform_mod.plan_stages(stack_plan)
            and stack_plan.config.node_feature_discovery.create else []) + (
            ["the weights-import Jobs"] if any(m.weights_import for m in stack_plan.models) else [])
        lines.append(f"general-purpose NodePool: {'/'.join(cpu.instance_types)} up to {cpu.cpu_limit} CPU, for "
                     + ", ".join(what + ["the model stacks' routers and imports"]))
    if stack_plan.config.image_cache.ecr_pull_through is not None:
        lines.extend(uncached_images_note([m.image for m in stack_plan.models]))
    lines += lone_router_notes(list(stack_plan.models))
    lines += standby_spot_notes(stack_plan)
    lines += yours_notes(stack_plan)
    unpinned = sorted({m.image for m in stack_plan.models if "@sha256:" not in m.image})
    if unpinned:
        lines.append(f"note: image(s) not pinned by digest: {', '.join(unpinned)}")
    hub = sorted({str(m.weights_import.hugging_face_repo) for m in stack_plan.models
                  if m.weights_import and m.weights_import.kind == "huggingFace"})
    if hub and stack_plan.config.hugging_face_token is None:
        lines.append(f"note: no warmstart:huggingFaceToken is set, so the import of {', '.join(hub)} fails if the "
                     "repository is gated (`pulumi config set --secret warmstart:huggingFaceToken hf_...`)")
    if stack_plan.config.account_id is None and plan_aws.derives_bucket_name(stack_plan.config):
        derived = stack_plan.derived_bucket_names
        lines.append("note: warmstart:accountId is not set, so the derived bucket names"
                     + (f" ({', '.join(derived)})" if derived else "") + " include no account: `warmstart up` (or "
                     "`preview`) of a stack with no resources yet records the deployer's account in the stack file "
                     "first, and the derived names then include it")
    # The driver comes with the node image: Auto Mode does not publish it, and a pinned AL2023
    # release's notes may not be at hand (docs/cluster-modes.md, "The NVIDIA driver").
    lines.append("note: the GPU nodes' NVIDIA driver comes with their AMI and is not known offline; the vLLM "
                 "image (CUDA 13) needs >= 580; the pods' nvme-check init container logs it")
    return "\n".join(lines)
