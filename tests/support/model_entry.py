"""The checks that keep a `models[]` entry's declarations one: every field of `ModelConfig` is a
key of the generated `ModelEntryArgs` (and back), and every field changes what is deployed.

Both take the model as a parameter, so a test can hand them a model with a throw-away field and
see them name it (tests/served_model/test_throwaway_field.py).
"""

from __future__ import annotations

import copy
import json
import tempfile
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from components.model_args_gen import camel_case
from tests.conftest import load_stack_doc, render_doc
from warmstart import render
from warmstart.config import ModelConfig

GENERATED = "components/model_args.py"
REFRESH = "python -m tests.golden"
MODELS_KEY = "warmstart:models"
THIS_FILE = "tests/support/model_entry.py"

# --------------------------------------------------------------------------------------
# ModelConfig <-> ModelEntryArgs


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _typeddicts_in(annotation: Any) -> list[type]:
    if typing.is_typeddict(annotation):
        return [annotation]
    return [t for arg in typing.get_args(annotation) for t in _typeddicts_in(arg)]


def _generated_file(args: type) -> str:
    """The generated module that declares `args` (components/model_args.py, section_args.py)."""
    return f"components/{args.__module__.rsplit('.', 1)[-1]}.py" if args.__module__.startswith("components.") \
        else GENERATED


def args_gaps(model: type[BaseModel], args: type, path: str = "") -> list[str]:
    """Where `model`'s fields (recursively) and the TypedDict `args` differ: a field without a
    key, a key without a field, a nested model without a nested TypedDict, a field required in
    one and not the other. Empty when they agree."""
    gaps: list[str] = []
    hints = typing.get_type_hints(args, include_extras=True)
    required = set(getattr(args, "__required_keys__", ()))
    where = path or model.__name__
    generated = _generated_file(args)
    for name, info in model.model_fields.items():
        key = f"{where}.{name}"
        if name not in hints:
            gaps.append(f"{key} (`{camel_case(name)}`) is missing from {generated} ({args.__name__}); "
                        f"regenerate it with `{REFRESH}`")
            continue
        if info.is_required() != (name in required):
            gaps.append(f"{key} is {'required' if info.is_required() else 'optional'} in {model.__name__} but not "
                        f"in {generated} ({args.__name__}.{name}); regenerate it with `{REFRESH}`")
        for inner in _models_in(info.annotation):
            typed = _typeddicts_in(hints[name])
            if not typed:
                gaps.append(f"{key} is the model {inner.__name__} but {args.__name__}.{name} no TypedDict; "
                            f"regenerate {generated} with `{REFRESH}`")
            else:
                gaps += args_gaps(inner, typed[0], key)
    for name in hints:
        if name not in model.model_fields:
            gaps.append(f"{args.__name__}.{name} in {generated} is no field of {where} ({model.__name__}); "
                        f"regenerate it with `{REFRESH}`")
    return gaps


# --------------------------------------------------------------------------------------
# Field reach: every field changes a deployed object


Doc = dict[str, Any]
Entry = dict[str, Any]


@dataclass(frozen=True)
class Sample:
    """A valid value of a field other than the baseline's, in a stack file's spelling."""

    value: Any
    setup: Callable[[Doc, Entry], None] | None = None
    """A change to the stack (and the entry) that both renders share, where the field acts only
    under a condition (e.g. a pool of several instance types); None: the stack as it is."""
    setup_name: str = ""
    """Names the setup, so renders of one setup share their baseline."""


def _pool(doc: Doc) -> dict[str, Any]:
    return doc["config"]["warmstart:gpuPools"][0]


def _two_instance_types(doc: Doc, entry: Entry) -> None:
    _pool(doc)["instanceTypes"] = ["g6e.2xlarge", "g6e.4xlarge"]
    entry["instanceType"] = "g6e.2xlarge"


def _four_gpus(doc: Doc, entry: Entry) -> None:
    _pool(doc)["instanceTypes"] = ["g6e.12xlarge"]


def _second_pool(doc: Doc, entry: Entry) -> None:
    doc["config"]["warmstart:gpuPools"].append({"name": "l40s-b", "instanceTypes": ["g6e.2xlarge"]})


def _autoscaled(doc: Doc, entry: Entry) -> None:
    # Standby engines are pods KEDA keeps beside the awake ones: the model must autoscale.
    entry["autoscaling"] = {"minReplicas": 1, "maxReplicas": 2}


# Samples that cannot be derived from the field's type and value (see `auto_sample`): a field
# unset in the dev stack (None), a list, a nested model (one sample each), or a field that
# acts only under a condition its setup creates. Keys are ModelConfig's field names.
SAMPLES: dict[str, Sample] = {
    "name": Sample("llama-other"),
    "source": Sample("meta-llama/Llama-3.1-8B-Instruct-v2"),
    "instance_type": Sample("g6e.4xlarge", _two_instance_types, "a pool of g6e.2xlarge and g6e.4xlarge"),
    "tensor_parallel_size": Sample(2, _four_gpus, "a pool of g6e.12xlarge (4 GPUs)"),
    "image": Sample("vllm/vllm-openai:v0.33.1"),
    "compile_cache": Sample(False),
    "extra_args": Sample(["--seed", "7"]),
    "loader": Sample({"requestTimeoutMs": 5000}),
    "weights_import": Sample({"s3": "s3://other-weights/meta-llama/Llama-3.1-8B-Instruct"}),
    "routing": Sample({"policy": "round_robin"}),
    "autoscaling": Sample({"maxReplicas": 2}),
    "pool": Sample("l40s-b", _second_pool, "a second pool, l40s-b"),
    "priority_class_name": Sample("inference-high"),
    # Its upper bound (1 PiB) gives no derivable sample that still fits a GPU.
    "weights_gib": Sample(30.0),
    "standby": Sample({"count": 1}, _autoscaled, "an autoscaled model"),
}


def _scalar(info: FieldInfo) -> tuple[Any, dict[str, float]]:
    """The field's type without `| None` and `Annotated`, and its bounds (ge, gt, le, lt), wherever
    pydantic keeps them (the field's metadata, or an `Annotated` inside an optional)."""
    annotation, metadata = info.annotation, list(info.metadata)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = members[0] if len(members) == 1 else annotation
    while typing.get_origin(annotation) is typing.Annotated:
        annotation, *extra = typing.get_args(annotation)
        for e in extra:
            metadata += getattr(e, "metadata", [e])
    bounds = {k: getattr(m, k) for m in metadata for k in ("ge", "gt", "le", "lt") if getattr(m, k, None) is not None}
    return annotation, bounds


def auto_sample(info: FieldInfo, current: Any) -> list[Any]:
    """Values other than `current` (the baseline's value of the field) derived from the field's
    type: a bool flipped, an int one up (or down, within its bounds), a float halfway to its upper
    bound (or doubled), every other value of a Literal. Empty when none can be derived."""
    annotation, bounds = _scalar(info)
    if current is None:
        return []
    if typing.get_origin(annotation) is Literal:
        return [v for v in typing.get_args(annotation) if v != current]
    if isinstance(current, bool):
        return [not current] if annotation is bool else []
    hi = bounds.get("le", bounds.get("lt"))
    if isinstance(current, int) and annotation is int:
        up = current + 1
        if hi is None or up < hi or (up == hi and "le" in bounds):
            return [up]
        return [current - 1]
    if isinstance(current, (int, float)) and annotation is float:
        return [round((current + hi) / 2, 4) if hi is not None else (current * 2 if current else 1.0)]
    return []


@dataclass
class Reach:
    """What setting one field did to a render."""

    field: str
    key: str
    tried: list[Any]
    changed: bool
    setup_name: str

    def message(self, model: type[BaseModel]) -> str:
        setup = f" (with {self.setup_name})" if self.setup_name else ""
        return (f"{model.__name__}.{self.field} (`models[].{self.key}`) set to "
                f"{' / '.join(json.dumps(v) for v in self.tried)}{setup} changes no deployed object, cloud or "
                f"Kubernetes: a field that reaches nothing is a setting that silently does nothing. Wire it "
                f"through all three: warmstart/config.py (the field), warmstart/plan/model.py (the ModelPlan "
                f"records it) and the manifest builder in warmstart/manifests/ that turns it into objects; or, "
                f"if it acts only under a condition, give it a Sample with a setup in {THIS_FILE} (SAMPLES)")


def deployed(r: render.Rendered) -> frozenset[str]:
    """Every registered cloud resource and Kubernetes object with its inputs, as comparable text."""
    kept = [x for x in r.resources if render.is_kubernetes_object(x)] + r.cloud_resources
    return frozenset(json.dumps([x.typ, x.name, x.inputs], sort_keys=True, default=str) for x in kept)


class FieldReach:
    """Renders the dev stack with one field of its first model set to a sample, against the
    baseline of the same setup (each baseline rendered once)."""

    STACK = "reach"

    def __init__(self, stack: str = "dev", workdir: Path | None = None):
        self.doc = load_stack_doc(stack)
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="field-reach-"))
        self._baselines: dict[str, frozenset[str]] = {}
        self._count = 0

    def _render(self, doc: Doc) -> frozenset[str]:
        self._count += 1
        folder = self.workdir / f"r{self._count}"
        folder.mkdir(parents=True)
        return deployed(render_doc(doc, folder, self.STACK))

    def _setup(self, sample: Sample | None) -> tuple[Doc, Entry]:
        doc = copy.deepcopy(self.doc)
        entry = doc["config"][MODELS_KEY][0]
        if sample is not None and sample.setup is not None:
            sample.setup(doc, entry)
        return doc, entry

    def baseline(self, sample: Sample | None) -> frozenset[str]:
        name = sample.setup_name if sample is not None and sample.setup else ""
        if name not in self._baselines:
            self._baselines[name] = self._render(self._setup(sample)[0])
        return self._baselines[name]

    def samples(self, model: type[BaseModel], field: str) -> tuple[Sample | None, list[Any]]:
        """The table's sample of `field`, else the values `auto_sample` derives; (None, []) when
        there is neither."""
        if field in SAMPLES:
            return SAMPLES[field], [SAMPLES[field].value]
        info = model.model_fields[field]
        _, entry = self._setup(None)
        key = info.alias or field
        current = entry.get(key, info.default)
        if current is PydanticUndefined:
            return None, []
        return None, auto_sample(info, current)

    def check(self, model: type[BaseModel], field: str) -> Reach:
        """Whether some sample value of `field` changes the deployed objects. AssertionError,
        naming where to add a sample, when the field has none."""
        info = model.model_fields[field]
        key = info.alias or field
        sample, values = self.samples(model, field)
        if not values:
            raise AssertionError(
                f"{model.__name__}.{field} (`models[].{key}`) has no sample value for the field-reach check: "
                f"its type and the dev stack's value give none to derive; add one to SAMPLES in {THIS_FILE}")
        base = self.baseline(sample)
        for value in values:
            doc, entry = self._setup(sample)
            entry[key] = value
            if self._render(doc) != base:
                return Reach(field, key, [value], True, sample.setup_name if sample else "")
        return Reach(field, key, values, False, sample.setup_name if sample else "")
