"""The schemas rendered NodePools and node classes are validated against: the vendored Karpenter
CRDs (v1) and the reconstructed EKS Auto Mode NodeClass schema (tests/schemas/SOURCES.md)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"


@cache
def crd_schema(file: str) -> dict[str, Any]:
    """The v1 openAPIV3Schema of a vendored Karpenter CRD."""
    crd = yaml.safe_load((SCHEMAS / "karpenter" / file).read_text())
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return v1["schema"]["openAPIV3Schema"]


@cache
def validator(kind: str) -> jsonschema.Draft7Validator:
    """A validator for `NodePool`, `EC2NodeClass` or Auto Mode's `NodeClass`."""
    if kind == "NodePool":
        return jsonschema.Draft7Validator(crd_schema("karpenter.sh_nodepools.yaml"))
    if kind == "EC2NodeClass":
        return jsonschema.Draft7Validator(crd_schema("karpenter.k8s.aws_ec2nodeclasses.yaml"))
    # UNOFFICIAL: reconstructed from the EKS User Guide (tests/schemas/SOURCES.md); EKS publishes
    # no CRD for it outside a cluster.
    return jsonschema.Draft7Validator(json.loads(
        (SCHEMAS / "eks-auto-mode" / "nodeclass.eks.amazonaws.com_v1.reconstructed.schema.json").read_text()))
