"""What the host runs: the engines, in start order, read from one JSON file the render writes
(warmstart/decisions/standby_pool.py plans it: ports, `--gpu-memory-utilization`, order).

    {"sleepLevel": 1,
     "engines": [{"model": "qwen-7b", "port": 8100, "argv": ["vllm", "serve", ...], "env": {"VLLM_PORT": "20000"}}],
     "startupTimeoutSeconds": 1800, "sleepTimeoutSeconds": 600,
     "backoffInitialSeconds": 2, "backoffMaxSeconds": 60}

The file is read bounded (it comes from a ConfigMap, but a pod trusts nothing it reads) and every
field is checked; a bad file is one line naming the field and an exit code 2.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..common.shared import parse_json, read_regular

MAX_SPEC_BYTES = 1 << 20
MAX_ENGINES = 16
MODEL_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SpecError(ValueError):
    """A field of the spec file that cannot be run, and why."""


@dataclass(frozen=True)
class EngineSpec:
    model: str
    port: int
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class HostSpec:
    engines: tuple[EngineSpec, ...]
    sleep_level: int = 1
    startup_timeout_s: float = 1800.0
    """One engine's start (process to /health 200), past which it is killed and retried."""
    sleep_timeout_s: float = 600.0
    """One engine's first sleep (at level 1 its weights copied to host RAM)."""
    backoff_initial_s: float = 2.0
    backoff_max_s: float = 60.0


def _number(doc: dict, key: str, default: float, low: float, high: float) -> float:
    v = doc.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= high:
        raise SpecError(f"{key} must be a number in [{low:g}, {high:g}], got {v!r}")
    return float(v)


def parse(doc: object) -> HostSpec:
    if not isinstance(doc, dict):
        raise SpecError("the spec must be a JSON object")
    unknown = set(doc) - {"sleepLevel", "engines", "startupTimeoutSeconds", "sleepTimeoutSeconds",
                          "backoffInitialSeconds", "backoffMaxSeconds"}
    if unknown:
        raise SpecError(f"unknown field(s) {sorted(unknown)}")
    level = doc.get("sleepLevel", 1)
    if level not in (1, 2) or isinstance(level, bool):
        raise SpecError(f"sleepLevel must be 1 or 2, got {level!r}")
    raw = doc.get("engines")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_ENGINES:
        raise SpecError(f"engines must be a list of 1 to {MAX_ENGINES} engines")
    engines, models, ports = [], set(), set()
    for i, e in enumerate(raw):
        where = f"engines[{i}]"
        if not isinstance(e, dict) or set(e) - {"model", "port", "argv", "env"}:
            raise SpecError(f"{where} must be an object of model, port, argv, env")
        model, port, argv, env = e.get("model"), e.get("port"), e.get("argv"), e.get("env", {})
        if not isinstance(model, str) or not MODEL_NAME.match(model) or model in models:
            raise SpecError(f"{where}.model must be a unique DNS label of at most 40 characters, got {model!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535 or port in ports:
            raise SpecError(f"{where}.port must be a unique port in [1024, 65535], got {port!r}")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a for a in argv):
            raise SpecError(f"{where}.argv must be a non-empty list of non-empty strings")
        if not isinstance(env, dict) or not all(isinstance(k, str) and ENV_NAME.match(k) and isinstance(v, str)
                                                for k, v in env.items()):
            raise SpecError(f"{where}.env must map variable names to strings")
        models.add(model)
        ports.add(port)
        engines.append(EngineSpec(model=model, port=port, argv=tuple(argv), env=dict(env)))
    backoff_initial = _number(doc, "backoffInitialSeconds", 2.0, 0.05, 600)
    return HostSpec(engines=tuple(engines), sleep_level=level,
                    startup_timeout_s=_number(doc, "startupTimeoutSeconds", 1800.0, 1, 86400),
                    sleep_timeout_s=_number(doc, "sleepTimeoutSeconds", 600.0, 1, 86400),
                    backoff_initial_s=backoff_initial,
                    backoff_max_s=max(backoff_initial, _number(doc, "backoffMaxSeconds", 60.0, 0.05, 3600)))


def load(path: Path) -> HostSpec:
    # A ConfigMap's file is a symbolic link into its `..data` folder, which the kubelet swaps
    # atomically on an update (kubernetes pkg/volume/util/atomic_writer.go): resolved first, then
    # the file it names is read without following a link.
    raw = read_regular(Path(os.path.realpath(path)), MAX_SPEC_BYTES)
    if isinstance(raw, str):
        raise SpecError(f"{path}: {raw}")
    doc, why = parse_json(raw, max_depth=8)
    if why is not None:
        raise SpecError(f"{path}: {why}")
    return parse(doc)
