"""Rendered KEDA objects against the vendored KEDA CRDs (tests/schemas/keda/)."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import yaml

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas" / "keda"


def crd_validator(file: str) -> jsonschema.Draft7Validator:
    doc = yaml.safe_load((SCHEMAS / file).read_text())
    (version,) = [v for v in doc["spec"]["versions"] if v["name"] == "v1alpha1"]
    return jsonschema.Draft7Validator(version["schema"]["openAPIV3Schema"])


SCALED_OBJECT = crd_validator("keda.sh_scaledobjects.yaml")


TRIGGER_AUTH = crd_validator("keda.sh_triggerauthentications.yaml")


def validate_keda(obj: dict) -> None:
    v = {"ScaledObject": SCALED_OBJECT, "TriggerAuthentication": TRIGGER_AUTH}[obj["kind"]]
    errors = sorted(v.iter_errors(obj), key=str)
    assert not errors, [e.message for e in errors]
