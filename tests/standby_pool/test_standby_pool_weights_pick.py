"""A staged member's engine command on a host, run as the supervisor runs it (argv and env from the
rendered spec, warmstart/podside/engine_host/supervisor.py `Popen(argv, env=...)`): the real weights
picker, then a stand-in `vllm` that records the path it was given. The node's complete copy is
picked where it is there, the S3 URI otherwise, and a restart picks again (issue 38 item 4)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.standby_pool.pooled import pooled_config
from tests.support.node_cache import SELECT
from tests.support.weights_import import clean_environ
from warmstart import config
from warmstart.manifests import node_cache
from warmstart.manifests import standby_pool as objects
from warmstart.plan.stack import plan_stack
from warmstart.podside.engine_host import spec as host_spec_file

pytestmark = pytest.mark.servers


def staged_engine():
    cfg = pooled_config(sleepLevel=2)
    cfg["models"][0]["nodeCache"] = "on"
    p = plan_stack(config.parse_config(cfg), "pooled")
    (plan,) = p.standby_pools
    w = objects.wiring(plan, p.models, namespace="inference", region="us-east-1", api_server_cidrs=["10.0.0.1/32"],
                       nvme_mount="/mnt/k8s-disks/0")
    spec = host_spec_file.parse(json.loads(objects.host_spec_config_map(plan, w)["data"]["spec.json"]))
    member = next(m for m in p.models if m.name == "chat-a")
    return next(e for e in spec.engines if e.model == "chat-a"), member


def run(engine, tmp: Path, root: Path) -> list[str]:
    """The engine's argv with the container's paths moved under `tmp` (the picker's script, its
    output folder, the node directory), a `vllm` on PATH that writes its arguments and exits."""
    bin_dir, out, opt = tmp / "bin", tmp / "run", tmp / "opt"
    for d in (bin_dir, out, opt):
        d.mkdir(exist_ok=True)
    (opt / node_cache.SELECT_SCRIPT).write_bytes(SELECT.read_bytes())
    got = tmp / "vllm-args.json"
    fake = bin_dir / "vllm"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nopen({str(got)!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)

    def moved(s: str) -> str:
        return (s.replace(node_cache.SCRIPT_MOUNT, str(opt)).replace(node_cache.CHOICE_MOUNT, str(out))
                .replace(objects.engine_weights_root("chat-a"), str(root)))
    argv = [moved(a) for a in engine.argv]
    env = {**clean_environ(), **{k: moved(v) for k, v in engine.env.items()},
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=60)
    return json.loads(got.read_text())


def test_the_engine_starts_from_the_nodes_copy_where_complete_and_from_s3_otherwise(tmp_path):
    engine, member = staged_engine()
    root = tmp_path / "node" / "chat-a"
    root.mkdir(parents=True)
    # No copy on the node yet: the member's S3 URI, then its own flags and the pool's.
    args = run(engine, tmp_path, root)
    assert args[:2] == ["serve", member.source]
    assert f"--port={engine.port}" in args and "--enable-sleep-mode" in args
    assert f"--served-model-name={member.name}" in args
    # The staging pod completes the copy; the engine restarts (the supervisor's restart runs the
    # same argv) and picks it, so its level-2 reloads read the node's NVMe from then on.
    copy = root / member.weights_digest
    copy.mkdir()
    (copy / "model.safetensors").write_bytes(b"x" * 10)
    (copy / ".warmstart-complete.json").write_text(json.dumps({
        "format": "warmstart-weights-stage/1", "digest": member.weights_digest, "source": member.source,
        "files": [{"key": "model.safetensors", "size": 10, "etag": "e"}]}))
    args = run(engine, tmp_path, root)
    assert args[:2] == ["serve", str(copy)]
    # A copy cut short (a file missing its bytes) is not picked: S3 again, never a stale choice.
    (copy / "model.safetensors").write_bytes(b"x")
    assert run(engine, tmp_path, root)[:2] == ["serve", member.source]
