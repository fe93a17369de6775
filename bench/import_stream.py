#!/usr/bin/env python3
"""The Hub import of a model several times larger than its scratch, killed mid-way and restarted.

The import script runs as its Job runs it (a file, this interpreter, the real huggingface_hub and
boto3) against the project's Hub stand-in (tests/podside/hub.py) and `rclone serve s3`
(tests/podside/servers.py), both on 127.0.0.1, with a counting proxy in front of S3
(tests/podside/faults.py: the body size of every PUT and POST). The model is scaled down from a
real one (Llama-3.1-70B: 30 shards of ~4.7 GB through 40 GiB of scratch, 3.3 x): by default
1 GiB of 32 MiB shards through 256 MiB of scratch (4 x), 8 MiB parts.

One run, side by side:
    first   the import, SIGKILLed once half of the shards are recorded as verified (the Job's
            pod lost: no cleanup of any kind)
    second  the import again, with a new, empty scratch (a retried pod gets a new emptyDir)

Measured: the scratch folder's size, polled every 20 ms across both runs (its peak against the
bound, WARMSTART_SCRATCH_BYTES); every byte the client sent to S3, per object; and at the end
every object read back and hashed against the source.

    python bench/import_stream.py [--gib 1] [--shard-mib 32] [--scratch-mib 256] [--workdir /tmp]

The last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from urllib.parse import unquote, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.podside.faults import FaultProxy  # noqa: E402
from tests.podside.hub import HubStandIn  # noqa: E402
from tests.podside.servers import RcloneS3  # noqa: E402
from tests.support.weights_import import COMMIT, Job, body, ensure_bucket, objects, sha, through  # noqa: E402
from warmstart.podside.weights_import import settings as wi  # noqa: E402

MIB = 1 << 20
BUCKET = "models"
# Beside the files in flight the scratch holds what the budget does not count: the index read to
# plan and the Hub client's metadata files (KiB each). The Job's emptyDir keeps 2 GiB for them
# (decisions/weights_import.py SCRATCH_EXTRA_BYTES); the bench allows 1 MiB.
EXTRA = MIB


def model(total: int, shard: int, seed: int = 7) -> dict[str, bytes]:
    rnd = random.Random(seed)
    count = max(1, total // shard)
    names = [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
    files = {n: rnd.randbytes(shard) for n in names}
    index = {"metadata": {"total_size": shard * count}, "weight_map": {f"w.{i}": n for i, n in enumerate(names)}}
    files |= {"config.json": b'{"architectures": ["LlamaForCausalLM"]}', "tokenizer.json": rnd.randbytes(MIB),
              "model.safetensors.index.json": json.dumps(index).encode()}
    return files


class ScratchPoll:
    """The size of every file under a folder, summed every `every_s`; `peak` the largest seen."""

    def __init__(self, root: Path, every_s: float = 0.02):
        self.root, self.every_s, self.peak, self.samples = root, every_s, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _size(self) -> int:
        total = 0
        for folder, _, names in os.walk(self.root):
            for n in names:
                try:
                    total += os.lstat(os.path.join(folder, n)).st_blocks * 512
                except OSError:
                    pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._size())
            self.samples += 1
            self._stop.wait(self.every_s)

    def __enter__(self) -> "ScratchPoll":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _key_of(path: str) -> str:
    """The object key of an S3 request path (path-style: /bucket/key?query)."""
    return unquote(urlsplit(path).path).split("/", 2)[2]


def measure(workdir: Path, total: int, shard: int, scratch: int, part: int = 8 * MIB,
            kill_fraction: float = 0.5, timeout_s: float = 900) -> dict:
    files = model(total, shard)
    weights = sum(len(v) for k, v in files.items() if k.endswith(".safetensors"))
    prefix = "bench/org/large"
    with RcloneS3(workdir / "rclone") as server, HubStandIn() as hub, FaultProxy(server.endpoint) as proxy:
        ensure_bucket(server, BUCKET)
        hub.add("org/large", COMMIT, files)
        scratch_root = workdir / "scratch"
        env = {"WARMSTART_MODEL": "large", "WARMSTART_DEST_BUCKET": BUCKET, "WARMSTART_DEST_PREFIX": prefix,
               "WARMSTART_WEIGHTS_GIB": repr(weights / (1 << 30)), "WARMSTART_HF_REPO": "org/large",
               "WARMSTART_HF_REVISION": COMMIT, "WARMSTART_PART_BYTES": str(part),
               "WARMSTART_SCRATCH_BYTES": str(scratch), "WARMSTART_FILE_PARALLELISM": "4",
               "WARMSTART_MAX_CONCURRENCY": "8", "HF_ENDPOINT": hub.url, "HF_HOME": str(workdir / "hf-home"),
               "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
               "HF_XET_CHUNK_CACHE_SIZE_BYTES": "0"}
        job = through(Job(server, env), proxy)
        shards = sorted(n for n in files if n.endswith(".safetensors"))
        polls = [ScratchPoll(scratch_root / "pod-1"), ScratchPoll(scratch_root / "pod-2")]
        with polls[0]:
            started = time.monotonic()
            proc = job.spawn(WARMSTART_SCRATCH_DIR=str(scratch_root / "pod-1"))
            verified_at_kill: list[str] = []
            try:
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline and proc.poll() is None:
                    try:
                        doc = json.loads(body(server, BUCKET, f"{prefix}/{wi.MANIFEST_NAME}"))
                        verified_at_kill = sorted(doc.get("verified") or {})
                    except Exception:  # noqa: BLE001 - not written yet
                        verified_at_kill = []
                    if len(verified_at_kill) >= kill_fraction * len(shards):
                        break
                    time.sleep(0.05)
                killed = proc.poll() is None
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=60)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=60)
            first_s = time.monotonic() - started
        # The killed pod's emptyDir goes with it; a retried pod gets a new, empty one.
        shutil.rmtree(scratch_root / "pod-1", ignore_errors=True)
        with polls[1]:
            doc = json.loads(body(server, BUCKET, f"{prefix}/{wi.MANIFEST_NAME}"))
            verified_at_kill = sorted(doc.get("verified") or {})
            sent_first = len(proxy.sent)
            started = time.monotonic()
            second = job.run(timeout=timeout_s, WARMSTART_SCRATCH_DIR=str(scratch_root / "pod-2"))
            second_s = time.monotonic() - started
        sent = defaultdict(int)
        for method, path, n in proxy.sent:
            sent[_key_of(path)] += n
        resent_in_second = {_key_of(p) for _, p, n in proxy.sent[sent_first:] if n} - {f"{prefix}/{wi.MANIFEST_NAME}"}
        found = objects(server, BUCKET, prefix)
        manifest = json.loads(body(server, BUCKET, f"{prefix}/{wi.MANIFEST_NAME}"))
        recorded = {f["name"]: f.get("sha256") for f in manifest["files"]}
        wanted = {n for n in files}
        bad = sorted(n for n in wanted if n not in found or sha(body(server, BUCKET, f"{prefix}/{n}")) != sha(files[n])
                     or recorded.get(n) != sha(files[n]))
        per_file = {n: sent[f"{prefix}/{n}"] / len(files[n]) for n in wanted}
        # Over 1 % more than the file: sent again (botocore's aws-chunked framing of a body with its
        # trailing checksum adds a few bytes per part, far under that).
        twice = sorted(n for n, r in per_file.items() if r > 1.01)
        copy = second.phase("copy") if second.returncode == 0 else {}
        return {
            "model_bytes": sum(len(v) for v in files.values()), "weights_bytes": weights, "files": len(files),
            "shard_bytes": shard, "scratch_bound_bytes": scratch, "part_bytes": part,
            "model_over_scratch": round(weights / scratch, 2),
            "killed_mid_copy": killed, "verified_at_kill": len(verified_at_kill), "shards": len(shards),
            "first_run_s": round(first_s, 1), "second_run_s": round(second_s, 1),
            "second_exit": second.returncode, "second_copied_files": copy.get("files"),
            "manifest_status": manifest.get("status"), "files_in_s3_and_verified": len(wanted) - len(bad),
            "files_bad": bad, "scratch_peak_bytes": max(p.peak for p in polls),
            "scratch_polls": sum(p.samples for p in polls),
            "scratch_peak_over_bound": round(max(p.peak for p in polls) / scratch, 3),
            "budget_peak_bytes": copy.get("scratch_peak_bytes"),
            "uploaded_bytes": sum(v for k, v in sent.items() if not k.endswith(wi.MANIFEST_NAME)),
            "uploaded_over_model": round(sum(v for k, v in sent.items() if not k.endswith(wi.MANIFEST_NAME))
                                         / sum(len(v) for v in files.values()), 3),
            "files_uploaded_more_than_once": twice,
            "reuploaded_verified_before_kill": sorted(set(twice) & set(verified_at_kill)),
            "resent_in_second_run": len(resent_in_second),
            "verified_files_resent": sorted({k.rsplit("/", 1)[-1] for k in resent_in_second} & set(verified_at_kill)),
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--shard-mib", type=int, default=32)
    ap.add_argument("--scratch-mib", type=int, default=256)
    ap.add_argument("--part-mib", type=int, default=8)
    ap.add_argument("--workdir", type=Path, default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.workdir) as tmp:
        r = measure(Path(tmp), int(a.gib * (1 << 30)), a.shard_mib * MIB, a.scratch_mib * MIB, a.part_mib * MIB)
    print(f"model {r['weights_bytes'] / MIB:.0f} MiB in {r['shards']} shards through {r['scratch_bound_bytes'] / MIB:.0f} MiB "
          f"of scratch ({r['model_over_scratch']} x); first run SIGKILLed after {r['verified_at_kill']}/{r['shards']} "
          f"shards verified ({r['first_run_s']} s), second run exit {r['second_exit']} ({r['second_run_s']} s, "
          f"{r['second_copied_files']} files copied)")
    print(f"in S3 and verified (sha256 of the object read back = source = manifest): {r['files_in_s3_and_verified']}/"
          f"{r['files']}, manifest {r['manifest_status']}")
    print(f"scratch peak {r['scratch_peak_bytes'] / MIB:.2f} MiB = {r['scratch_peak_over_bound']} x the files' bound "
          f"of {r['scratch_bound_bytes'] / MIB:.0f} MiB (+ {EXTRA / MIB:.0f} MiB for the index and metadata; "
          f"{r['scratch_polls']} polls); the budget's own peak {(r['budget_peak_bytes'] or 0) / MIB:.1f} MiB")
    print(f"uploaded {r['uploaded_bytes'] / MIB:.1f} MiB = {r['uploaded_over_model']} x the model; files uploaded more "
          f"than once: {len(r['files_uploaded_more_than_once'])} (in flight at the kill), of them verified before the "
          f"kill: {len(r['reuploaded_verified_before_kill'])}")
    print(json.dumps(r, sort_keys=True))
    ok = (r["second_exit"] == 0 and not r["files_bad"] and r["scratch_peak_bytes"] <= r["scratch_bound_bytes"] + EXTRA
          and not r["reuploaded_verified_before_kill"] and r["killed_mid_copy"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
