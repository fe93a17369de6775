"""PodScript alone, from its own arguments under Pulumi mocks: one ConfigMap that carries the
pod-side script byte for byte, in the namespace it is given."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate

from components.pod_scripts import PodScript
from warmstart import mocks
from warmstart.manifests import nvme_check
from warmstart.podside import nvme_check as script


def test_a_pod_script_is_one_configmap_carrying_the_script_as_shipped():
    resources = mocks.run(lambda: PodScript("m-nvme-check", "ml", nvme_check.CONFIGMAP_NAME, nvme_check.SCRIPT_KEY),
                          region="us-east-1", stack="alone")
    (cm,) = [r.inputs for r in resources if r.typ == "kubernetes:core/v1:ConfigMap"]
    assert (cm["metadata"]["name"], cm["metadata"]["namespace"]) == (nvme_check.CONFIGMAP_NAME, "ml")
    assert cm["data"] == {nvme_check.SCRIPT_KEY: Path(script.__file__).read_text()}
    kubernetes_validate.validate(cm, "1.33", strict=True)
    assert {r.typ for r in resources} == {"warmstart:serving:PodScript", "kubernetes:core/v1:ConfigMap"}
