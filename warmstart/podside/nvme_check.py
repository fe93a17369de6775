#!/usr/bin/env python3
"""Start-up check: is the cache directory on the node's local NVMe instance store?

Runs as an init container of every serving pod that uses the compile cache, in the vLLM
image (python3, standard library only). The failure it reports is silent otherwise: a
`hostPath` whose node directory is not on the NVMe is created on the root EBS volume without
any error, and the cache then runs at EBS speed (~1 GB/s instead of ~30; "Set the cache path
to NVMe instance store" in
https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html).

How it decides (the first rule that decides wins):

1. The block device of the path (`st_dev`), followed down in sysfs to the physical disks:
   through `slaves/` of an md RAID or a device-mapper target, from a partition to its disk.
   Each NVMe disk names its product in `device/model`: EC2 instance store reports
   "Amazon EC2 NVMe Instance Storage", EBS "Amazon Elastic Block Store". Device NAMES prove
   nothing: on Nitro the root EBS volume is an NVMe device too (nvme0n1).
   Any EBS disk underneath -> not NVMe. Only instance-store disks -> NVMe.
2. When sysfs cannot tell (not mounted or readable, or a virtual device such as overlay or
   tmpfs, whose st_dev has major 0), /proc/self/mountinfo gives the mount's filesystem type
   and source, and the filesystem's size is compared with the smallest size the pool's NVMe
   RAID can have (`--min-bytes`, derived by warmstart from the pool's instance types):
   - tmpfs, overlay and other memory or layered filesystems, FUSE (`fuse`, `fuse.*`, `fuseblk`)
     and network or cluster filesystems (NFS/EFS, Lustre/FSx, CIFS/SMB, Ceph, GlusterFS, ...)
     -> not NVMe, however large (an FSx for Lustre volume is larger than any NVMe RAID);
   - smaller than the minimum -> not NVMe: it is the root volume or Auto Mode's EBS data
     volume (warmstart keeps both well below the NVMe of every type a pool allows);
   - source /dev/nvme0n1 or a partition of it -> not NVMe (the Nitro boot volume);
   - source /dev/md* -> NVMe (neither cluster mode RAIDs EBS volumes);
   - at least the minimum -> NVMe (nothing else on these nodes is that large);
   - otherwise: unknown.

`--mode warn` (default) logs the verdict and exits 0 whatever happens: an unreadable or
non-UTF-8 mountinfo line or disk model, a malformed variable, even a bug in this script, is a
WARNING line and the pod starts. `--mode fail` exits 1 unless the verdict is NVMe, so the pod
does not start (the reason is in the log and in the container's termination message).

Environment (each also a flag): WARMSTART_NVME_CHECK_PATH (--path, default /compile-cache),
WARMSTART_NVME_CHECK_MODE (--mode, warn | fail; anything else is warn, with a warning),
WARMSTART_NVME_MIN_BYTES (--min-bytes, an integer; malformed is treated as unset, with a
warning), WARMSTART_NVME_HOST_PATH (--host-path, logged), WARMSTART_MIN_NVIDIA_DRIVER
(--min-driver, default 580; malformed is the default, with a warning).

It also logs the node's NVIDIA driver version (`/sys/module/nvidia/version`, readable from any
container): the vLLM image is a CUDA 13 build, which needs driver 580 or newer (CUDA Toolkit
release notes, https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html), and which
driver a node has is decided by its AMI, not by warmstart. An older driver is a WARNING line;
it never stops the pod by itself (vLLM then fails with the CUDA error).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "warmstart nvme-check"
INSTANCE_STORE_MODEL = "Amazon EC2 NVMe Instance Storage"
EBS_MODEL = "Amazon Elastic Block Store"
# Filesystems that are never a disk: memory, the container's own layers, network or FUSE.
NOT_A_DISK_FSTYPES = frozenset({"tmpfs", "ramfs", "overlay", "aufs", "squashfs", "nfs", "nfs4", "fuse",
                                "fuseblk", "9p", "virtiofs", "proc", "sysfs", "devtmpfs", "lustre", "cifs", "smb3",
                                "smbfs", "ceph", "glusterfs", "gpfs", "beegfs", "afs", "ocfs2", "gfs2", "orangefs",
                                "davfs", "sshfs", "efs"})
# fuse.<driver> (fuse.s3fs, fuse.mountpoint-s3, fuse.glusterfs, fuse.juicefs ...) and fuseblk: proc(5).
NOT_A_DISK_PREFIXES = ("fuse.", "nfs")
NITRO_BOOT_SOURCE = re.compile(r"^/dev/nvme0n1(p\d+)?$")

NVME, NOT_NVME, UNKNOWN = "nvme", "not-nvme", "unknown"
# The oldest NVIDIA driver branch the vLLM image (a CUDA 13 build) runs on.
MIN_NVIDIA_DRIVER_MAJOR = 580


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo (proc(5))."""

    mount_id: int
    major: int
    minor: int
    root: str
    """Path inside the source filesystem that is mounted here (a bind mount's directory)."""
    mount_point: str
    fstype: str
    source: str


@dataclass(frozen=True)
class Disk:
    name: str
    model: str | None

    @property
    def kind(self) -> str:
        if self.model and INSTANCE_STORE_MODEL.lower() in self.model.lower():
            return "instance-store"
        if self.model and EBS_MODEL.lower() in self.model.lower():
            return "ebs"
        return "other"


@dataclass(frozen=True)
class Facts:
    """What the check knows about the path, gathered by `gather` (or made up by a test)."""

    path: str
    major: int
    minor: int
    size_bytes: int
    mount: Mount | None
    disks: tuple[Disk, ...] | None
    """Physical disks under the path's device; None when sysfs could not tell."""
    min_nvme_bytes: int | None


@dataclass(frozen=True)
class Verdict:
    status: str
    reason: str
    details: dict = field(default_factory=dict)


def not_a_disk(fstype: str) -> bool:
    """Memory, layered, FUSE or network filesystems: never the node's local NVMe."""
    return fstype in NOT_A_DISK_FSTYPES or fstype.startswith(NOT_A_DISK_PREFIXES)


def decode(data: bytes) -> str:
    """Bytes from the kernel as text: paths and model strings need not be UTF-8. surrogateescape
    keeps the bytes, so a path read here still matches os.stat's view of it."""
    return data.decode("utf-8", "surrogateescape")


def printable(text: str) -> str:
    """Text that any stdout encoding can print (a non-UTF-8 mount point would not be)."""
    return text.encode("ascii", "backslashreplace").decode("ascii") if not text.isascii() else text


def _unescape(field_: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040 ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_)


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if "-" not in parts or len(parts) < 7:
            continue
        sep = parts.index("-")
        if len(parts) < sep + 3:
            continue
        major, _, minor = parts[2].partition(":")
        try:
            mounts.append(Mount(
                mount_id=int(parts[0]), major=int(major), minor=int(minor), root=_unescape(parts[3]),
                mount_point=_unescape(parts[4]), fstype=parts[sep + 1], source=_unescape(parts[sep + 2])))
        except ValueError:
            continue  # not a mountinfo line
    return mounts


def mount_for(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount that holds `path`: the longest mount point above it (the later one wins a tie,
    as it is mounted over the earlier)."""
    path = os.path.normpath(path)
    best = None
    for m in mounts:
        mp = os.path.normpath(m.mount_point)
        if path == mp or path.startswith(mp.rstrip("/") + "/"):
            if best is None or len(mp) >= len(os.path.normpath(best.mount_point)):
                best = m
    return best


def _read(path: Path) -> str | None:
    try:
        return decode(path.read_bytes()).strip()
    except OSError:
        return None


def physical_disks(sysfs: Path, major: int, minor: int) -> tuple[Disk, ...] | None:
    """The physical disks under block device major:minor, or None when sysfs cannot tell."""
    start = sysfs / "dev" / "block" / f"{major}:{minor}"
    if major == 0 or not start.exists():
        return None
    found: dict[str, Disk] = {}
    seen: set[str] = set()

    def walk(node: Path) -> bool:
        node = Path(os.path.realpath(node))
        if str(node) in seen:
            return True
        seen.add(str(node))
        slaves = node / "slaves"
        members = sorted(slaves.iterdir()) if slaves.is_dir() else []
        if members:
            return all(walk(m) for m in members)
        if (node / "partition").exists():
            return walk(node.parent)
        model = _read(node / "device" / "model")
        found[node.name] = Disk(node.name, model)
        return True

    try:
        walk(start)
    except OSError:
        return None
    return tuple(sorted(found.values(), key=lambda d: d.name)) if found else None


def _gb(n: int) -> str:
    return f"{n / 1e9:.0f} GB"


def decide(f: Facts) -> Verdict:
    """The verdict for the gathered facts (pure; the rules are in the module docstring)."""
    details = {"path": f.path, "device": f"{f.major}:{f.minor}", "sizeBytes": f.size_bytes}
    if f.mount:
        details |= {"source": f.mount.source, "fstype": f.mount.fstype, "mountRoot": f.mount.root}
    if f.min_nvme_bytes:
        details["minNvmeBytes"] = f.min_nvme_bytes
    small = bool(f.min_nvme_bytes) and f.size_bytes < f.min_nvme_bytes
    if f.disks:
        details["disks"] = [f"{d.name}={d.kind}" for d in f.disks]
        kinds = {d.kind for d in f.disks}
        if "ebs" in kinds:
            ebs = ", ".join(d.name for d in f.disks if d.kind == "ebs")
            return Verdict(NOT_NVME, f"{f.path} is on an EBS volume ({ebs}), not the local NVMe", details)
        if kinds == {"instance-store"}:
            names = ", ".join(d.name for d in f.disks)
            note = ""
            if small:
                note = (f"; but the filesystem ({_gb(f.size_bytes)}) is smaller than the pool's NVMe RAID "
                        f"(>= {_gb(f.min_nvme_bytes or 0)}): not every drive is in it")
            return Verdict(NVME, f"{f.path} is on NVMe instance storage ({names}){note}", details)
    m = f.mount
    if m and not_a_disk(m.fstype):
        return Verdict(NOT_NVME, f"{f.path} is on {m.fstype}, not a local disk: the hostPath is not on the node's "
                       "NVMe", details)
    if small:
        return Verdict(NOT_NVME, f"{f.path} is on a {_gb(f.size_bytes)} filesystem, smaller than the pool's NVMe "
                       f"RAID can be (>= {_gb(f.min_nvme_bytes or 0)}): it is the root or an EBS data volume",
                       details)
    if m and NITRO_BOOT_SOURCE.match(m.source):
        return Verdict(NOT_NVME, f"{f.path} is on {m.source}, the Nitro boot (EBS) volume", details)
    if m and m.source.startswith("/dev/md"):
        return Verdict(NVME, f"{f.path} is on the RAID {m.source} (EKS RAIDs only instance store)", details)
    if f.min_nvme_bytes and not small:
        return Verdict(NVME, f"{f.path} is on a {_gb(f.size_bytes)} filesystem, as large as only the NVMe "
                       "RAID is on these nodes", details)
    return Verdict(UNKNOWN, f"cannot tell whether {f.path} is on local NVMe (no sysfs model, no size bound)", details)


def gather(path: str, mountinfo: str, sysfs: Path, min_nvme_bytes: int | None) -> Facts:
    st = os.stat(path)
    vfs = os.statvfs(path)
    mount = mount_for(os.path.realpath(path), parse_mountinfo(mountinfo))
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    disks = physical_disks(sysfs, major, minor)
    if disks is None and mount is not None and mount.major != 0:
        disks = physical_disks(sysfs, mount.major, mount.minor)
    return Facts(path=path, major=major, minor=minor, size_bytes=vfs.f_blocks * vfs.f_frsize, mount=mount,
                 disks=disks, min_nvme_bytes=min_nvme_bytes)


def nvidia_driver(sysfs: Path) -> str | None:
    """The loaded NVIDIA kernel module's version (`580.159.03`), or None without one."""
    return _read(sysfs / "module" / "nvidia" / "version") or None


def driver_line(version: str | None, min_major: int) -> tuple[bool, str]:
    """(ok, the log line) for the node's NVIDIA driver."""
    if version is None:
        return False, (f"{PREFIX}: WARNING: NVIDIA driver: unknown (no /sys/module/nvidia/version: the "
                       f"nvidia module is not loaded); the vLLM image needs >= {min_major}")
    major = version.split(".")[0]
    if major.isdigit() and int(major) < min_major:
        return False, (f"{PREFIX}: WARNING: NVIDIA driver {version} is older than {min_major}, which the "
                       "vLLM image (CUDA 13) needs: vLLM will fail to initialise CUDA; use an AMI with a "
                       f"newer driver")
    return True, f"{PREFIX}: NVIDIA driver {version} (the vLLM image needs >= {min_major})"


def _int_setting(name: str, raw: str | None, problems: list[str]) -> int | None:
    """An optional integer setting; a malformed one is noted in `problems` and treated as unset."""
    if raw is None or not raw.strip():
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        problems.append(f"{name}={raw!r} is not an integer; ignored (fix: a whole number of bytes, as warmstart "
                        "renders it)")
        return None
    if value < 0:
        problems.append(f"{name}={raw!r} is negative; ignored")
        return None
    return value


def _say(line: str, stream: object) -> None:
    print(printable(line), file=stream, flush=True)  # type: ignore[arg-type]


def main(argv: list[str] | None = None, env: dict[str, str] | None = None) -> int:
    env = dict(os.environ) if env is None else env
    ap = argparse.ArgumentParser(description="Is the cache path on local NVMe instance storage?")
    ap.add_argument("--path", default=env.get("WARMSTART_NVME_CHECK_PATH", "/compile-cache"))
    ap.add_argument("--mode", default=env.get("WARMSTART_NVME_CHECK_MODE", "warn"))
    ap.add_argument("--min-bytes", default=env.get("WARMSTART_NVME_MIN_BYTES"))
    ap.add_argument("--host-path", default=env.get("WARMSTART_NVME_HOST_PATH", ""))
    ap.add_argument("--mountinfo", default="/proc/self/mountinfo")
    ap.add_argument("--sysfs", default="/sys")
    ap.add_argument("--termination-log", default="/dev/termination-log")
    ap.add_argument("--min-driver", default=env.get("WARMSTART_MIN_NVIDIA_DRIVER"))
    args = ap.parse_args(argv)
    problems: list[str] = []
    mode = args.mode.strip().lower()
    if mode not in ("warn", "fail"):
        problems.append(f"WARMSTART_NVME_CHECK_MODE={args.mode!r} is neither warn nor fail; checking in warn mode")
        mode = "warn"
    try:
        return _check(args, mode, problems)
    except Exception as exc:  # noqa: BLE001 - warn mode promises to let the pod through
        line = f"{PREFIX}: {'ERROR' if mode == 'fail' else 'WARNING'}: the check itself failed: " \
               f"{type(exc).__name__}: {exc}"
        _say(line + (" - refusing to start (nvmeCheck: fail)" if mode == "fail" else " - starting anyway"), sys.stderr)
        if mode == "fail":
            _termination(args.termination_log, line)
            return 1
        return 0


def _termination(path: str, line: str) -> None:
    try:
        Path(path).write_text(printable(line)[:4000])
    except OSError:
        pass


def _check(args: argparse.Namespace, mode: str, problems: list[str]) -> int:
    min_bytes = _int_setting("WARMSTART_NVME_MIN_BYTES", args.min_bytes, problems)
    min_driver = _int_setting("WARMSTART_MIN_NVIDIA_DRIVER", args.min_driver, problems) or MIN_NVIDIA_DRIVER_MAJOR
    for problem in problems:
        _say(f"{PREFIX}: WARNING: {problem}", sys.stderr)
    if mode == "fail" and any(p.startswith("WARMSTART_NVME_MIN_BYTES") for p in problems):
        # In fail mode an unset size bound can only weaken the check: refuse rather than guess.
        line = f"{PREFIX}: ERROR: {problems[0]} - refusing to start (nvmeCheck: fail)"
        _say(line, sys.stderr)
        _termination(args.termination_log, line)
        return 1

    # Logged first, on stdout, so the NVMe verdict stays the last line (and its JSON the end of
    # stderr) whatever the driver.
    _say(driver_line(nvidia_driver(Path(args.sysfs)), min_driver)[1], sys.stdout)

    try:
        mountinfo = decode(Path(args.mountinfo).read_bytes())
        facts = gather(args.path, mountinfo, Path(args.sysfs), min_bytes)
        verdict = decide(facts)
    except OSError as err:
        verdict = Verdict(UNKNOWN, f"cannot inspect {args.path}: {err}")
    details = verdict.details | ({"hostPath": args.host_path} if args.host_path else {})
    ok = verdict.status == NVME
    level = "OK" if ok else ("ERROR" if mode == "fail" else "WARNING")
    consequence = "" if ok else (" - refusing to start (nvmeCheck: fail)" if mode == "fail" else
                                 " - starting anyway; the cache runs at EBS speed (set nvmeCheck: fail to stop)")
    line = f"{PREFIX}: {level}: {verdict.reason}{consequence} {json.dumps(details, sort_keys=True)}"
    _say(line, sys.stdout if ok else sys.stderr)
    if not ok and mode == "fail":
        _termination(args.termination_log, line)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
