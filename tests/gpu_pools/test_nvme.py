"""Keeping the caches on NVMe: pool sizing rules, the config errors they raise, and the start-up check.

The failure guarded against is silent: a compile cache whose hostPath is not on the node's NVMe
lands on the root EBS volume with no error
(https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.stacks import render_stack
from tests.support.pod_scripts import artifact
from warmstart import config
from warmstart.decisions import gpu_pools, instances, placement
from warmstart.decisions.instances import GB, GIB, GpuInstance
from warmstart.errors import ConfigErrors
from warmstart.manifests import nvme_check as nvme_check_manifest
from warmstart.manifests import pod_scripts
from warmstart.manifests.nvme_check import nvme_check_min_bytes
from warmstart.manifests.serving import COMPILE_CACHE_VOLUME
from warmstart.plan import stack as plan
from warmstart.podside import nvme_check

SCRIPT = artifact("nvme_check.pyz")


def _instance(name: str = "x1.test", nvme_gb: int = 450, gpus: int = 1) -> GpuInstance:
    """A synthetic instance type (the real table has NVMe on every row)."""
    return dataclasses.replace(instances.lookup("g6e.2xlarge"), instance_type=name, nvme_total_gb=nvme_gb,
                               gpu_count=gpus)


nvme_gb = st.integers(min_value=1, max_value=64000)


# --------------------------------------------------------------------------------------
# Pure sizing rules


@given(st.lists(nvme_gb, min_size=1, max_size=6))
def test_auto_mode_ephemeral_storage_stays_below_the_smallest_nvme(sizes):
    insts = [_instance(f"t{i}", s) for i, s in enumerate(sizes)]
    smallest = gpu_pools.smallest_nvme_bytes(insts)
    try:
        size = gpu_pools.auto_mode_ephemeral_storage_gib(smallest)
    except gpu_pools.PoolError:
        assert smallest < 2 * GIB  # only absurdly small NVMe leaves no valid size
        return
    assert 1 <= size <= gpu_pools.AUTO_MODE_DEFAULT_EPHEMERAL_GIB
    # Strictly below every type's NVMe, read as bytes and as "GB read as GiB" alike.
    for i in insts:
        assert size * GIB < i.nvme_total_bytes and size < i.nvme_total_gb


@given(nvme_gb, nvme_gb)
def test_auto_mode_ephemeral_storage_is_monotone_in_the_nvme(a, b):
    lo, hi = sorted((a, b))
    try:
        small = gpu_pools.auto_mode_ephemeral_storage_gib(lo * GB)
    except gpu_pools.PoolError:
        return
    assert gpu_pools.auto_mode_ephemeral_storage_gib(hi * GB) >= small


@given(nvme_gb, st.integers(min_value=1, max_value=70000))
def test_requested_ephemeral_storage_is_rejected_at_or_above_the_nvme(gb, requested):
    nvme = gb * GB
    if requested * GIB >= nvme:
        with pytest.raises(gpu_pools.PoolError, match="not smaller than the pool's smallest NVMe"):
            gpu_pools.auto_mode_ephemeral_storage_gib(nvme, requested)
    elif requested <= gpu_pools.AUTO_MODE_EPHEMERAL_RANGE_GIB[1]:
        assert gpu_pools.auto_mode_ephemeral_storage_gib(nvme, requested) == requested


@given(st.integers(min_value=0, max_value=40), nvme_gb)
def test_a_pool_that_passes_the_nvme_check_passes_its_own_nodepool_floor(models, gb):
    inst = _instance(nvme_gb=gb)
    required = gpu_pools.required_nvme_bytes(models)
    try:
        gpu_pools.check_nvme([inst], required)
    except gpu_pools.PoolError:
        assert not gpu_pools.nvme_fits(inst, required)
        return
    assert inst.nvme_total_bytes >= required
    assert gpu_pools.nvme_label_admits(inst, gpu_pools.nvme_label_floor(required))


def test_every_instance_in_the_table_fits_the_base_reserve_and_one_cache():
    for inst in instances.catalog().values():
        gpu_pools.check_nvme([inst], gpu_pools.required_nvme_bytes(1))


def test_an_instance_without_nvme_is_rejected():
    with pytest.raises(gpu_pools.PoolError, match=r"x0\.test has no local NVMe instance store"):
        gpu_pools.check_nvme([_instance("g6e.2xlarge"), _instance("x0.test", nvme_gb=0)], gpu_pools.required_nvme_bytes(1))


def test_nvme_too_small_for_the_cache_is_rejected():
    with pytest.raises(gpu_pools.PoolError, match=r"x1\.test \(100 GB\) cannot hold"):
        gpu_pools.check_nvme([_instance(nvme_gb=100)], gpu_pools.required_nvme_bytes(1))


@given(st.integers(min_value=1, max_value=8), st.sampled_from([1, 2, 4, 8]), st.integers(min_value=0, max_value=9))
def test_pool_limits_count_whole_nodes(gpus, tp, replicas):
    if tp > gpus:
        with pytest.raises(gpu_pools.PoolError):
            gpu_pools.nodes_for(gpu_pools.PoolModel(_instance(gpus=gpus), tp, replicas), replicas)
        return
    m = gpu_pools.PoolModel(_instance(gpus=gpus), tp, replicas)
    need = gpu_pools.gpus_needed([m])
    assert need % gpus == 0 and need >= replicas * tp
    assert gpu_pools.default_max_gpus([m], [m.instance]) >= gpu_pools.gpus_needed([m], surge=1) >= need


# --------------------------------------------------------------------------------------
# The same rules through the config path (what `warmstart render` reports, exit 2)


def _config(mode: str, itype: str, **pool) -> dict:
    return {
        "clusterMode": mode, "region": "us-west-2", "modelBucket": {"name": "b-models"},
        "gpuPools": [{"name": "pool", "instanceTypes": [itype], **pool}],
        "models": [{"name": "m", "source": "s3://b-models/m", "weightsGiB": 15, "pool": "pool"}],
    }


@pytest.mark.parametrize("mode", ["auto", "karpenter"])
def test_config_with_an_instance_type_without_nvme_fails_with_a_config_error(mode, monkeypatch):
    real = instances.catalog()
    fake = dict(real) | {"x0.test": _instance("x0.test", nvme_gb=0)}
    monkeypatch.setattr(instances, "catalog", lambda: fake)
    with pytest.raises(ConfigErrors) as err:
        plan.plan_stack(config.parse_config(_config(mode, "x0.test")), "t")
    (e,) = err.value.errors
    assert e.key == "warmstart:gpuPools[0].instanceTypes" and "no local NVMe" in e.rule and e.value == ["x0.test"]


@pytest.mark.parametrize("mode", ["auto", "karpenter"])
def test_config_with_tp_above_the_gpus_per_node_fails_with_a_config_error(mode):
    cfg = _config(mode, "g6e.2xlarge")
    cfg["models"][0]["tensorParallelSize"] = 2
    with pytest.raises(ConfigErrors, match=r"tensorParallelSize=2 needs 2 GPUs but g6e\.2xlarge has 1"):
        plan.plan_stack(config.parse_config(cfg), "t")


def test_auto_mode_ephemeral_storage_from_config():
    p = plan.plan_stack(config.parse_config(_config("auto", "g6e.2xlarge")), "t")
    (pool,) = p.cluster.pools
    assert pool.ephemeral_storage_gib == gpu_pools.AUTO_MODE_DEFAULT_EPHEMERAL_GIB
    p = plan.plan_stack(config.parse_config(_config("auto", "g6e.2xlarge", ephemeralStorageGiB=419)), "t")
    assert p.cluster.pools[0].ephemeral_storage_gib == 419  # 450 GB = 419.1 GiB
    with pytest.raises(ConfigErrors, match=r"ephemeralStorageGiB=420 is not smaller"):
        plan.plan_stack(config.parse_config(_config("auto", "g6e.2xlarge", ephemeralStorageGiB=420)), "t")


# --------------------------------------------------------------------------------------
# Pod wiring: every compile-cached model checks the very volume its cache is on


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_cached_model_runs_the_nvme_check_on_its_cache_volume(stack):
    r = render_stack(stack)
    (cm,) = [o for o in r.kind("ConfigMap") if o["metadata"]["name"] == nvme_check_manifest.CONFIGMAP_NAME]
    assert base64.b64decode(cm["binaryData"][nvme_check_manifest.SCRIPT_KEY]) == SCRIPT.read_bytes()
    pools = {p.name: p for p in r.stack_plan.cluster.pools}
    for m in r.stack_plan.models:
        (dep,) = [d for d in r.kind("Deployment") if d["metadata"]["name"] == m.name]
        pod = dep["spec"]["template"]["spec"]
        checks = [c for c in pod.get("initContainers", []) if c["name"] == nvme_check_manifest.INIT_CONTAINER]
        if not m.compile_cache:
            assert not checks
            continue
        (check,) = checks
        env = {e["name"]: e["value"] for e in check["env"]}
        (cache_mount,) = [v for v in check["volumeMounts"] if v["mountPath"] == env["WARMSTART_NVME_CHECK_PATH"]]
        (vllm_mount,) = [v for v in pod["containers"][0]["volumeMounts"] if v["mountPath"] == placement.COMPILE_CACHE_MOUNT]
        assert cache_mount["name"] == vllm_mount["name"] == COMPILE_CACHE_VOLUME
        (volume,) = [v for v in pod["volumes"] if v["name"] == COMPILE_CACHE_VOLUME]
        assert volume["hostPath"]["path"] == env["WARMSTART_NVME_HOST_PATH"]
        assert volume["hostPath"]["path"].startswith(placement.NVME_MOUNT[r.stack_plan.cluster_mode] + "/")
        assert check["image"] == pod["containers"][0]["image"]  # no extra image to pull
        assert env["WARMSTART_NVME_CHECK_MODE"] == r.stack_plan.config.cluster.nvme_check
        pool = pools[m.pool]
        assert int(env["WARMSTART_NVME_MIN_BYTES"]) == nvme_check_min_bytes(pool.min_nvme_bytes) < pool.min_nvme_bytes
        annotations = dep["spec"]["template"]["metadata"]["annotations"]
        assert annotations[nvme_check_manifest.SCRIPT_ANNOTATION] == pod_scripts.script_digest(nvme_check_manifest.SCRIPT_KEY)


def test_nvme_check_fail_mode_reaches_the_pod(stack_doc, tmp_path):
    from tests.support.stacks import render_doc

    doc = stack_doc("dev")
    doc["config"]["warmstart:cluster"] = {"nvmeCheck": "fail"}
    r = render_doc(doc, tmp_path, stack="strict")
    (dep,) = r.kind("Deployment")
    inits = dep["spec"]["template"]["spec"]["initContainers"]
    (check,) = [c for c in inits if c["name"] == nvme_check_manifest.INIT_CONTAINER]
    assert inits[0] is check  # it runs before anything writes into the cache
    assert {"name": "WARMSTART_NVME_CHECK_MODE", "value": "fail"} in check["env"]


# --------------------------------------------------------------------------------------
# The check script's decision logic, on synthetic mountinfo and sysfs

MOUNTINFO_KARPENTER_RAID = "\n".join([
    "1288 1201 0:312 / / rw,relatime master:421 - overlay overlay rw,lowerdir=/var/lib/containerd/l1,upperdir=/mnt/k8s-disks/0/containerd/u,workdir=/w",
    "1289 1288 0:315 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw",
    "1300 1288 259:1 /var/lib/kubelet/pods/abc/etc-hosts /etc/hosts rw,noatime - xfs /dev/nvme0n1p1 rw,attr2",
    "1301 1288 9:127 /compile-cache/qwen-67b /compile-cache ro,noatime - xfs /dev/md127 rw,attr2,sunit=1024",
])
MOUNTINFO_EBS = "\n".join([
    "1288 1201 0:312 / / rw,relatime master:421 - overlay overlay rw",
    "1301 1288 259:1 /mnt/k8s-disks/0/compile-cache/qwen-67b /compile-cache rw,noatime - xfs /dev/nvme0n1p1 rw",
])


def _disk(sysfs: Path, major: int, minor: int, name: str, model: str | None, partition_of: str | None = None,
          slaves: tuple[str, ...] = ()) -> None:
    """A block device in a fake sysfs: /sys/dev/block/M:m -> devices/.../<name>."""
    base = sysfs / "devices" / "pci0000:00"
    node = (base / partition_of / name) if partition_of else base / name
    node.mkdir(parents=True, exist_ok=True)
    if partition_of:
        (node / "partition").write_text("1\n")
    elif model is not None:
        (node / "device").mkdir(exist_ok=True)
        (node / "device" / "model").write_text(model + "                \n")
    if slaves:
        (node / "slaves").mkdir(exist_ok=True)
        for s in slaves:
            os.symlink(os.path.relpath(base / s, node / "slaves"), node / "slaves" / s)
    (sysfs / "dev" / "block").mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(node, sysfs / "dev" / "block"), sysfs / "dev" / "block" / f"{major}:{minor}")


@pytest.fixture
def sysfs(tmp_path) -> Path:
    root = tmp_path / "sys"
    _disk(root, 259, 0, "nvme0n1", nvme_check.EBS_MODEL)
    _disk(root, 259, 1, "nvme0n1p1", None, partition_of="nvme0n1")
    _disk(root, 259, 2, "nvme1n1", nvme_check.INSTANCE_STORE_MODEL)
    _disk(root, 259, 3, "nvme2n1", nvme_check.INSTANCE_STORE_MODEL)
    _disk(root, 9, 127, "md127", None, slaves=("nvme1n1", "nvme2n1"))
    _disk(root, 259, 4, "nvme3n1", nvme_check.EBS_MODEL)  # an extra EBS data volume
    _disk(root, 253, 0, "dm-0", None, slaves=("nvme3n1",))
    return root


def test_mountinfo_parsing_and_longest_prefix_match():
    mounts = nvme_check.parse_mountinfo(MOUNTINFO_KARPENTER_RAID + "\n" +
                                        r"1400 1288 0:50 / /data\040dir rw - tmpfs tmpfs rw" + "\ngarbage line\n")
    assert [m.mount_point for m in mounts] == ["/", "/proc", "/etc/hosts", "/compile-cache", "/data dir"]
    m = nvme_check.mount_for("/compile-cache/vllm/torch_compile_cache", mounts)
    assert (m.source, m.fstype, m.root, m.major, m.minor) == ("/dev/md127", "xfs", "/compile-cache/qwen-67b", 9, 127)
    assert nvme_check.mount_for("/compile-cachex", mounts).mount_point == "/"
    assert nvme_check.mount_for("/data dir/a", mounts).fstype == "tmpfs"


def test_sysfs_walk_reaches_the_physical_disks(sysfs):
    names = lambda ds: [(d.name, d.kind) for d in ds]  # noqa: E731
    assert names(nvme_check.physical_disks(sysfs, 9, 127)) == [("nvme1n1", "instance-store"), ("nvme2n1", "instance-store")]
    assert names(nvme_check.physical_disks(sysfs, 259, 1)) == [("nvme0n1", "ebs")]  # partition -> its disk
    assert names(nvme_check.physical_disks(sysfs, 253, 0)) == [("nvme3n1", "ebs")]  # device-mapper
    assert nvme_check.physical_disks(sysfs, 0, 312) is None  # overlay: a virtual device
    assert nvme_check.physical_disks(sysfs, 8, 0) is None  # not in sysfs


def _facts(**kw) -> nvme_check.Facts:
    base = dict(path="/compile-cache", major=9, minor=127, size_bytes=3_700 * GB, mount=None, disks=None,
                min_nvme_bytes=int(0.8 * 3_800 * GB))
    return nvme_check.Facts(**(base | kw))


def _mount(source: str, fstype: str = "xfs", major: int = 9, minor: int = 127) -> nvme_check.Mount:
    return nvme_check.Mount(1, major, minor, "/compile-cache/m", "/compile-cache", fstype, source)


IS, EBS = nvme_check.Disk("nvme1n1", nvme_check.INSTANCE_STORE_MODEL), nvme_check.Disk("nvme0n1", nvme_check.EBS_MODEL)


@pytest.mark.parametrize("facts, status", [
    # sysfs knows the disks: the model string decides, names do not.
    (_facts(disks=(IS, dataclasses.replace(IS, name="nvme2n1"))), nvme_check.NVME),
    (_facts(disks=(EBS,), size_bytes=100 * GIB), nvme_check.NOT_NVME),
    (_facts(disks=(IS, EBS)), nvme_check.NOT_NVME),  # a RAID that includes EBS is not the NVMe
    (_facts(disks=(IS,), size_bytes=100 * GB), nvme_check.NVME),  # NVMe, but a partial RAID (noted)
    # sysfs cannot tell: mountinfo and size.
    (_facts(mount=_mount("tmpfs", "tmpfs", 0, 40), major=0), nvme_check.NOT_NVME),
    (_facts(mount=_mount("/dev/nvme1n1"), size_bytes=80 * GIB), nvme_check.NOT_NVME),  # Auto Mode EBS data volume
    (_facts(mount=_mount("/dev/nvme0n1p1"), min_nvme_bytes=None), nvme_check.NOT_NVME),  # Nitro boot volume
    (_facts(mount=_mount("/dev/md127"), min_nvme_bytes=None), nvme_check.NVME),
    (_facts(mount=_mount("/dev/nvme1n1")), nvme_check.NVME),  # large enough to be only the NVMe
    (_facts(mount=_mount("/dev/nvme1n1"), min_nvme_bytes=None), nvme_check.UNKNOWN),
    (_facts(mount=None, min_nvme_bytes=None), nvme_check.UNKNOWN),
])
def test_decision_rules(facts, status):
    v = nvme_check.decide(facts)
    assert v.status == status, v.reason
    assert facts.path in v.reason


def test_the_check_on_a_real_path_with_synthetic_mountinfo_and_sysfs(tmp_path, sysfs):
    """gather() stats the real directory; the fake sysfs describes that directory's device."""
    cache = tmp_path / "cache"
    cache.mkdir()
    dev = os.stat(cache).st_dev
    major, minor = os.major(dev), os.minor(dev)
    if (sysfs / "dev" / "block" / f"{major}:{minor}").exists():
        pytest.skip("the test machine's device number collides with the fake sysfs")
    _disk(sysfs, major, minor, "nvme9n1", nvme_check.EBS_MODEL)
    mountinfo = f"1 0 {major}:{minor} / {tmp_path} rw - ext4 /dev/nvme9n1 rw\n"
    facts = nvme_check.gather(str(cache), mountinfo, sysfs, None)
    assert facts.mount.source == "/dev/nvme9n1" and [d.kind for d in facts.disks] == ["ebs"]
    assert nvme_check.decide(facts).status == nvme_check.NOT_NVME


def _run_script(tmp_path: Path, sysfs: Path, mode: str, disk_model: str) -> subprocess.CompletedProcess:
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    dev = os.stat(cache).st_dev
    node = sysfs / "dev" / "block" / f"{os.major(dev)}:{os.minor(dev)}"
    if node.is_symlink():
        node.unlink()
    _disk(sysfs, os.major(dev), os.minor(dev), f"disk-{mode}-{len(disk_model)}", disk_model)
    info = tmp_path / "mountinfo"
    info.write_text(f"1 0 {os.major(dev)}:{os.minor(dev)} / {cache} rw - ext4 /dev/nvme5n1 rw\n")
    term = tmp_path / "termination-log"
    # -I -S: isolated, no site-packages: the pod runs it with the standard library only.
    return subprocess.run(
        [sys.executable, "-I", "-S", str(SCRIPT), "--path", str(cache), "--mountinfo", str(info), "--sysfs", str(sysfs),
         "--mode", mode, "--termination-log", str(term)],
        capture_output=True, text=True, timeout=60, env={"PATH": os.environ.get("PATH", "")})


@pytest.mark.servers
def test_script_warn_mode_logs_and_starts(tmp_path, sysfs):
    proc = _run_script(tmp_path, sysfs, "warn", nvme_check.EBS_MODEL)
    assert proc.returncode == 0
    assert "warmstart nvme-check: WARNING:" in proc.stderr and "EBS volume" in proc.stderr
    assert "starting anyway" in proc.stderr
    details = json.loads(proc.stderr[proc.stderr.index("{"):])
    assert details["disks"] and details["path"].endswith("cache")


@pytest.mark.servers
def test_script_fail_mode_refuses_to_start_with_the_reason(tmp_path, sysfs):
    proc = _run_script(tmp_path, sysfs, "fail", nvme_check.EBS_MODEL)
    assert proc.returncode == 1
    assert "ERROR" in proc.stderr and "refusing to start" in proc.stderr
    assert "EBS volume" in (tmp_path / "termination-log").read_text()


@pytest.mark.servers
def test_script_passes_on_instance_store(tmp_path, sysfs):
    proc = _run_script(tmp_path, sysfs, "fail", nvme_check.INSTANCE_STORE_MODEL)
    assert proc.returncode == 0, proc.stderr
    assert "warmstart nvme-check: OK:" in proc.stdout


@settings(max_examples=200)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=400))
def test_mountinfo_parser_never_crashes(text):
    mounts = nvme_check.parse_mountinfo(text)
    nvme_check.mount_for("/compile-cache", mounts)


# --------------------------------------------------------------------------------------
# Issue 15: warn mode never blocks a pod; FUSE and network filesystems are never NVMe


@pytest.mark.parametrize("fstype", ["fuse.mountpoint-s3", "fuse.juicefs", "fuse", "fuseblk", "lustre", "cifs",
                                    "smb3", "ceph", "glusterfs", "nfs4", "virtiofs"])
def test_fuse_and_network_filesystems_are_never_nvme_however_large(fstype):
    facts = _facts(mount=_mount("fs-0123.fsx.us-east-1.amazonaws.com@tcp:/abc", fstype, 0, 77), major=0,
                   size_bytes=100_000 * GB)  # far above the pool's NVMe minimum
    v = nvme_check.decide(facts)
    assert v.status == nvme_check.NOT_NVME and fstype in v.reason


def _run_raw(tmp_path: Path, sysfs: Path, *, mode: str | None, mountinfo: bytes, model: bytes,
             env: dict[str, str] | None = None, cache_name: bytes = b"cache") -> subprocess.CompletedProcess:
    """The script as the pod runs it, over real files whose bytes need not be UTF-8."""
    cache = Path(os.fsdecode(os.path.join(os.fsencode(tmp_path), cache_name)))
    cache.mkdir(exist_ok=True)
    dev = os.stat(cache).st_dev
    node = sysfs / "dev" / "block" / f"{os.major(dev)}:{os.minor(dev)}"
    if node.is_symlink():
        node.unlink()
    _disk(sysfs, os.major(dev), os.minor(dev), "nvme7n1", "placeholder")
    (Path(os.path.realpath(node)) / "device" / "model").write_bytes(model)
    info = tmp_path / "mountinfo"
    line = b"1 0 %d:%d / %s rw - ext4 /dev/nvme7n1 rw\n" % (os.major(dev), os.minor(dev), os.fsencode(cache))
    info.write_bytes(mountinfo + line)
    args = [sys.executable, "-I", "-S", str(SCRIPT), "--path", os.fsencode(cache), "--mountinfo", str(info),
            "--sysfs", str(sysfs), "--termination-log", str(tmp_path / "termination-log")]
    if mode:
        args += ["--mode", mode]
    return subprocess.run(args, capture_output=True, timeout=60,
                          env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C", **(env or {})})


NON_UTF8_LINE = b"1500 1288 0:61 / /mnt/caf\xe9\xff\\040x rw - ext4 /dev/sd\xfe rw\n"


@pytest.mark.servers
@pytest.mark.parametrize("mode", ["warn", "fail"])
def test_non_utf8_mountinfo_and_disk_model_are_read_not_crashed_on(tmp_path, sysfs, mode):
    proc = _run_raw(tmp_path, sysfs, mode=mode, mountinfo=NON_UTF8_LINE,
                    model=nvme_check.INSTANCE_STORE_MODEL.encode() + b" \xff\xfe\n")
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert "Traceback" not in err, err
    assert proc.returncode == 0 and "warmstart nvme-check: OK:" in out, (out, err)  # still read as instance store


@pytest.mark.servers
def test_a_non_utf8_cache_path_is_checked_and_logged(tmp_path, sysfs):
    proc = _run_raw(tmp_path, sysfs, mode="warn", mountinfo=NON_UTF8_LINE, model=nvme_check.EBS_MODEL.encode(),
                    cache_name=b"cache-\xff")
    err = proc.stderr.decode()
    assert proc.returncode == 0 and "Traceback" not in err and "EBS volume" in err, err
    assert "cache-\\udcff" in err  # the undecodable byte, printed escaped


@pytest.mark.servers
@pytest.mark.parametrize("variable, value", [("WARMSTART_NVME_MIN_BYTES", "3.8TB"),
                                             ("WARMSTART_NVME_MIN_BYTES", "-5"),
                                             ("WARMSTART_MIN_NVIDIA_DRIVER", "r580"),
                                             ("WARMSTART_NVME_CHECK_MODE", "strict")])
def test_a_malformed_variable_in_warn_mode_is_a_warning_and_the_pod_starts(tmp_path, sysfs, variable, value):
    proc = _run_raw(tmp_path, sysfs, mode=None, mountinfo=b"", model=nvme_check.EBS_MODEL.encode(),
                    env={variable: value})
    err = proc.stderr.decode()
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert f"WARNING: {variable}={value!r}" in err and "EBS volume" in err  # the check still ran


@pytest.mark.servers
def test_a_malformed_minimum_in_fail_mode_refuses_naming_the_variable(tmp_path, sysfs):
    proc = _run_raw(tmp_path, sysfs, mode="fail", mountinfo=b"", model=nvme_check.INSTANCE_STORE_MODEL.encode(),
                    env={"WARMSTART_NVME_MIN_BYTES": "lots"})
    err = proc.stderr.decode()
    assert proc.returncode == 1 and "Traceback" not in err
    assert "WARMSTART_NVME_MIN_BYTES='lots' is not an integer" in (tmp_path / "termination-log").read_text()


def test_warn_mode_survives_a_crash_of_the_check_itself(tmp_path, monkeypatch, capsys):
    def boom(*args, **kwargs):
        raise RuntimeError("unexpected")

    monkeypatch.setattr(nvme_check, "gather", boom)
    info = tmp_path / "mountinfo"
    info.write_bytes(b"")
    argv = ["--path", str(tmp_path), "--mountinfo", str(info), "--sysfs", str(tmp_path / "nosys"),
            "--termination-log", str(tmp_path / "term")]
    assert nvme_check.main([*argv, "--mode", "warn"], env={}) == 0
    assert "the check itself failed: RuntimeError: unexpected - starting anyway" in capsys.readouterr().err
    assert nvme_check.main([*argv, "--mode", "fail"], env={}) == 1
    assert "RuntimeError" in (tmp_path / "term").read_text()
