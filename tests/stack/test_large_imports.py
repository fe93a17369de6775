"""A 140 GB and a 640 GB Hub model (tests/stacks_large/: Llama-3.1-70B-Instruct in bf16 and
DeepSeek-R1 in FP8) render with a weights import and no manual step, on real instance types."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.stacks import ROOT
from warmstart import render
from warmstart.decisions import instances
from warmstart.decisions import weights_import as imports
from warmstart.decisions.instances import GIB

STACKS = ROOT / "tests" / "stacks_large"


@pytest.fixture(scope="module", params=["large-70b", "large-r1"])
def rendered(request) -> tuple[str, render.Rendered]:
    return request.param, render.run_program(STACKS, request.param, program_dir=ROOT)


def test_the_large_hub_model_renders_with_its_import_job_and_no_refusal(rendered):
    stack, r = rendered
    (m,) = r.stack_plan.models
    imp = m.weights_import
    assert imp is not None and imp.kind == "huggingFace"
    # Larger than the disk of the node the import runs on: only a streamed import takes it.
    assert m.weights_bytes > imports.NODE_EPHEMERAL_BYTES[r.stack_plan.config.cluster_mode]
    jobs = [o for o in r.kubernetes_objects if o["kind"] == "Job" and o["metadata"]["name"] == imp.job_name]
    (job,) = jobs
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    (vol,) = [v for v in pod["volumes"] if v["name"] == "scratch"]
    size_limit = int(vol["emptyDir"]["sizeLimit"].removesuffix("Gi")) * GIB
    assert size_limit < imports.NODE_EPHEMERAL_BYTES[r.stack_plan.config.cluster_mode] < m.weights_bytes
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert int(env["WARMSTART_SCRATCH_BYTES"]) >= imports.ASSUMED_LARGEST_FILE_BYTES * int(env["WARMSTART_FILE_PARALLELISM"])
    assert c["resources"]["requests"]["cpu"] == imports.LARGE_IMPORT_CPU
    # `pulumi up` waits for the Job's deadline, which grows with the weights.
    assert int(job["metadata"]["annotations"]["pulumi.com/timeoutSeconds"]) > job["spec"]["activeDeadlineSeconds"] \
        >= imports.deadline_seconds(m.weights_bytes)


def test_the_large_model_fits_the_gpus_of_a_real_instance_type(rendered):
    _, r = rendered
    (m,) = r.stack_plan.models
    inst = instances.lookup(m.instance.instance_type)
    assert m.tensor_parallel_size <= inst.gpu_count
    # The weights fit the TP group's GPU memory with room left for the KV cache.
    assert m.weights_bytes < m.tensor_parallel_size * inst.gpu_memory_bytes * m.gpu_memory_utilization


def test_the_render_says_what_the_import_will_do(rendered):
    _, r = rendered
    (m,) = r.stack_plan.models
    line = render.import_line(m)
    assert line is not None and line in render.table(r.stack_plan)
    predicted = imports.predicted_seconds(m.weights_bytes)
    assert "predicted ~" in line and f"{m.weights_import.scratch_bytes // GIB} GiB of scratch" in line
    assert predicted < m.weights_import.deadline_seconds
