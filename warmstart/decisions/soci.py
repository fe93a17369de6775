"""SOCI parallel image pull for Karpenter-mode GPU nodes: the EC2NodeClass `userData` (pure).

A vLLM image is ~10 GB compressed; containerd's default pull downloads and unpacks layers
one at a time. AL2023's nodeadm switches containerd to the SOCI snapshotter in
parallel-pull-unpack mode when the NodeConfig feature gate `FastImagePull` is on (the gate is
"FastImagePull" in `nodeadm/api/v1alpha1/nodeconfig_types.go` and
`nodeadm/internal/containerd/config.go` of https://github.com/awslabs/amazon-eks-ami, which
also skips it below 4 vCPUs / 7 GiB; AWS blog "Introducing Seekable OCI parallel pull mode for
Amazon EKS",
https://aws.amazon.com/blogs/containers/introducing-seekable-oci-parallel-pull-mode-for-amazon-eks/).

The SOCI store on the RAID0 array: nodeadm's `setup-local-disks` bind-mounts
`/var/lib/soci-snapshotter-grpc` onto the instance-store RAID unless
`instance.localStorage.disabledMounts` lists `SOCI` (AL2023 AMI releases from v20260724 on,
`templates/al2023/runtime/bin/setup-local-disks` in the same repository). Warmstart's pinned
AMI (`versions.KARPENTER_AMI_ALIAS`) is newer, so the NodeConfig states the RAID0 strategy
(as Karpenter's `instanceStorePolicy: RAID0` does) and leaves that mount enabled: the older
workaround of re-rooting soci-snapshotter-grpc with a shell part (awslabs/ai-on-eks
`al2023_ec2nodeclass.tpl`) is not needed and not rendered.

EKS Auto Mode has SOCI parallel pull built in for its GPU instances and its node
configuration is not user-editable, so nothing is rendered there (docs/node-cache.md).

Karpenter merges this MIME multi-part document with its own NodeConfig (cluster details);
later parts win (https://karpenter.sh/v1.14/concepts/nodeclasses/#specuserdata).
"""

from __future__ import annotations

from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from typing import Any

import yaml

NODEADM_API = "node.eks.aws/v1alpha1"
NODEADM_CONTENT_TYPE = "application/node.eks.aws"
FAST_IMAGE_PULL = "FastImagePull"
LOCAL_STORAGE_STRATEGY = "RAID0"
# A fixed boundary keeps the rendered userData byte-identical between runs (no diff, no drift).
BOUNDARY = "WARMSTART-NODEADM"


def node_config(fast_image_pull: bool = True) -> dict[str, Any]:
    """The nodeadm NodeConfig part: FastImagePull on, NVMe as RAID0 with SOCI's store on it."""
    return {
        "apiVersion": NODEADM_API,
        "kind": "NodeConfig",
        "spec": {
            "featureGates": {FAST_IMAGE_PULL: fast_image_pull},
            "instance": {"localStorage": {"strategy": LOCAL_STORAGE_STRATEGY}},
        },
    }


def user_data(fast_image_pull: bool = True) -> str:
    """MIME multi-part userData for an AL2023 EC2NodeClass (`spec.userData`)."""
    doc = MIMEMultipart("mixed", boundary=BOUNDARY)
    part = MIMEText(yaml.safe_dump(node_config(fast_image_pull), sort_keys=True), "plain")
    part.replace_header("Content-Type", NODEADM_CONTENT_TYPE)
    del part["Content-Transfer-Encoding"]
    part["Content-Transfer-Encoding"] = "7bit"
    doc.attach(part)
    return doc.as_string()
