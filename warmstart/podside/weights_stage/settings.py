"""The weights stager's names and settings: the files it keeps in a model's node directory and
the bounds on reading them, Settings (read once from the environment), its outcome line, and
the deadline of one attempt.

Part of weights_stage.py, whose docstring has the commands, the life of a copy, the faults and
the environment; shipped with it as files of one ConfigMap folder (warmstart/manifests/pod_scripts.py).
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from pathlib import Path
from typing import Any, Mapping

from ..common.env import EnvReader
from ..common.shared import emit_line

EVENT = "warmstart.weights_stage"
MARKER = ".warmstart-complete.json"
MARKER_FORMAT = "warmstart-weights-stage/1"
LOADING_DIR = ".loading"
LOCK_FILE = ".lock"
PARTIAL_SUFFIX = ".partial"
SOURCE_SNAPSHOT = ".warmstart-source.json"
"""In `<digest>.partial/`: the listing (keys, sizes, ETags) the copy in it was made from, so a
resumed copy drops files of another source revision that `sync --size-only` would keep."""
IMPORT_MANIFEST = "warmstart-manifest.json"
"""The weights import's manifest in the source prefix (warmstart/podside/weights_import.py):
per-file sha256 (Hub imports) and the part size of its multipart copies."""
# Bounds on what is read from the node directory, which anything with write access to it can
# plant files in: a marker of a 1,000-file model is about 100 KB; json.loads of a document
# takes up to ~30x its size in memory, so 1 MiB stays far inside the containers' limits.
MAX_MARKER_BYTES = 1 << 20
MAX_PAUSE_FILE_BYTES = 4096
MAX_PAUSE_FILES = 256
MAX_JSON_DEPTH = 32
MIB = 1 << 20
ETAG_MD5 = re.compile(r"^[0-9a-f]{32}$")
ETAG_MULTIPART = re.compile(r"^(?P<md5>[0-9a-f]{32})-(?P<parts>[1-9][0-9]{0,4})$")
# A planted stager or copier must finish with margin inside terminationGracePeriodSeconds (30 s):
# s5cmd gets this long after SIGTERM, the unlabel call this long in all.
COPIER_STOP_S = 2.0
UNLABEL_TIMEOUT_S = 5.0
NFD_API = "nfd.k8s-sigs.io/v1alpha1"
NFD_NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"
STDERR_TAIL = 2000


class StageRefused(RuntimeError):
    """An expected refusal with a reason worth one log line."""


@dataclasses.dataclass(frozen=True)
class Settings:
    source: str
    digest: str
    root: Path
    s5cmd: str
    deadline_s: float
    workers: int
    min_free_share: float
    poll_s: float
    retry_s: float
    label: str
    max_pause_s: float
    content_check: str
    kube_api: str
    sa_dir: Path
    node: str
    pod: str
    pod_uid: str
    namespace: str
    endpoint: str
    child_env: dict[str, str] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    """The environment the copier runs with (the one read here: AWS credentials, region)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env

        def get(name: str, default: str = "") -> str:
            return env.get(name, "").strip() or default

        read = EnvReader(env)

        source = get("WARMSTART_WEIGHTS_SOURCE").rstrip("/")
        digest = get("WARMSTART_WEIGHTS_DIGEST")
        if not source.startswith("s3://") or not digest or "/" in digest or digest.startswith("."):
            raise StageRefused("WARMSTART_WEIGHTS_SOURCE (s3://...) and WARMSTART_WEIGHTS_DIGEST must be set")
        host, port = get("KUBERNETES_SERVICE_HOST"), get("KUBERNETES_SERVICE_PORT", "443")
        if get("WARMSTART_CONTENT_CHECK", "auto").lower() not in CONTENT_CHECKS:
            raise StageRefused(f"WARMSTART_CONTENT_CHECK={get('WARMSTART_CONTENT_CHECK')!r} is not one of "
                               f"{', '.join(CONTENT_CHECKS)} (models[].nodeCacheContentCheck)")
        settings = cls(
            source=source, digest=digest, root=Path(get("WARMSTART_WEIGHTS_ROOT", "/weights")),
            s5cmd=get("WARMSTART_S5CMD", "/opt/s5cmd/s5cmd"),
            deadline_s=read.number("WARMSTART_STAGE_DEADLINE_S", 3600),
            workers=read.number("WARMSTART_STAGE_WORKERS", 64, integer=True, minimum=1),
            min_free_share=read.number("WARMSTART_MIN_FREE_SHARE", 0.15),
            poll_s=max(0.05, read.number("WARMSTART_POLL_S", 1)),
            retry_s=max(1.0, read.number("WARMSTART_RETRY_S", 300)),
            label=get("WARMSTART_LABEL"),
            max_pause_s=max(0.0, read.number("WARMSTART_MAX_PAUSE_S", 1200)),
            content_check=get("WARMSTART_CONTENT_CHECK", "auto").lower(),
            kube_api=get("WARMSTART_KUBE_API", f"https://{host}:{port}" if host else ""),
            sa_dir=Path(get("WARMSTART_SA_DIR", "/var/run/secrets/kubernetes.io/serviceaccount")),
            node=get("NODE_NAME"), pod=get("POD_NAME"), pod_uid=get("POD_UID"),
            namespace=get("POD_NAMESPACE"), endpoint=get("AWS_ENDPOINT_URL"), child_env=dict(env))
        if read.problems:
            raise StageRefused("; ".join(read.problems))
        return settings

    @property
    def final(self) -> Path:
        return self.root / self.digest

    @property
    def partial(self) -> Path:
        return self.root / f"{self.digest}{PARTIAL_SUFFIX}"


def emit(record: Mapping[str, Any]) -> None:
    emit_line({"event": EVENT, **record}, sort_keys=True)


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


CONTENT_CHECKS = ("auto", "etag", "sha256", "size")
"""WARMSTART_CONTENT_CHECK (the stack key `models[].nodeCacheContentCheck`):
- auto: the strongest check S3 vouches for, per file (below); a file nothing can vouch for
  (an SSE-KMS object without a sha256, a part size that cannot be found) is kept on its size and
  ETag agreement, named once in the outcome line;
- etag, sha256: as auto, but a file that cannot be checked that way (`sha256`: only by a sha256)
  refuses the copy; the copy is kept (never copied again for it) and the refusal is logged once
  until the source changes;
- size: sizes and ETag agreement only."""
