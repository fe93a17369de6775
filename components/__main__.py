"""Entry point of warmstart's source-based Pulumi component package.

Pulumi's Python language host runs this file when a program in any language uses the package
(`pulumi package add <repo>/components`); it serves the hosted components, whose schema the SDK
infers from their Args and docstrings (`pulumi.provider.experimental`).
https://www.pulumi.com/docs/iac/guides/building-extending/packages/source-based-plugin/
"""

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script by the language host: the repository root holds the `warmstart` core and
    # this folder, importable as the `components` package.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from components import (  # noqa: E402
        Cluster, ModelAutoscaling, ModelImportRole, ModelRole, ModelRouter, ModelStandby, ModelStorage, Monitoring, Network,
        ServedModel, ServingPlatform, VllmModel)
else:
    from . import (
        Cluster, ModelAutoscaling, ModelImportRole, ModelRole, ModelRouter, ModelStandby, ModelStorage, Monitoring, Network,
        ServedModel, ServingPlatform, VllmModel)

from pulumi.provider.experimental import component_provider_host  # noqa: E402

from warmstart import versions  # noqa: E402

PACKAGE = "warmstart"
HOSTED = [ServedModel, ServingPlatform, Network, Cluster, ModelStorage, ModelRole, ModelImportRole, VllmModel,
          ModelRouter, Monitoring, ModelAutoscaling, ModelStandby]


def version() -> str:
    """The package's version (warmstart/versions.py, the one place it is written), not the
    installed metadata's, which an editable install keeps from the day it was installed."""
    return versions.WARMSTART_VERSION


if __name__ == "__main__":
    component_provider_host(HOSTED, PACKAGE, version=version())
