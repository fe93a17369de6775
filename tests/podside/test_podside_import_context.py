"""maxModelLen against the model's own config.json in the weights import (issue 39, item 13):
the script runs as the Job runs it, against SeaweedFS (S3 to S3) and the Hub stand-in with
rclone. vLLM refuses a --max-model-len above what it derives from config.json only when the
engine starts on a GPU node; the import refuses it first (exit 2, one line with the fix) and
writes no manifest, so the stager and the Deployment never start a model that cannot run."""

from __future__ import annotations

import json

import pytest

from tests.podside.servers import BUCKET
from tests.support.weights_import import COMMIT, DST, SRC, assert_copied, objects
from warmstart.podside.weights_import import settings as weights_import_settings

pytestmark = pytest.mark.servers

# The keys vLLM's rule reads, as Qwen2.5-7B-Instruct publishes them
# (https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json) and as Llama 3.1 does
# (https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/config.json).
QWEN = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "max_position_embeddings": 32768,
        "rope_theta": 1000000.0, "sliding_window": 131072, "use_sliding_window": False}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "max_position_embeddings": 131072,
         "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                          "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
YARN = json.dumps({"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}})


def test_s3_import_refuses_a_max_model_len_above_the_config_before_copying_anything(s3_job, prefix):
    job, files = s3_job
    job.server.client().put_object(Bucket=BUCKET, Key=f"{SRC}/{prefix}/config.json", Body=json.dumps(QWEN).encode())
    run = job.run(WARMSTART_MAX_MODEL_LEN="131072")
    assert run.returncode == weights_import_settings.EXIT_CONFIG, (run.stdout, run.stderr)
    assert run.phases[-1] == ("plan", "error") and "Traceback" not in run.stderr
    assert "models[].maxModelLen is 131,072" in run.reason
    assert "allows at most 32,768 tokens (max_position_embeddings)" in run.reason
    assert "set models[].maxModelLen to at most 32768" in run.reason and "--hf-overrides" in run.reason
    assert objects(job.server, BUCKET, f"{DST}/{prefix}") == {}, "nothing copied, no manifest"
    # Within the limit, or with the model card's YaRN turned on by --hf-overrides: imported.
    ok = job.run(WARMSTART_MAX_MODEL_LEN="131072", WARMSTART_HF_OVERRIDES=YARN)
    assert ok.returncode == 0, (ok.stdout, ok.stderr)
    assert (ok.phase("plan")["max_model_len"], ok.phase("plan")["model_max_len"]) == (131072, 131072)
    assert_copied(job.server, BUCKET, f"{DST}/{prefix}", files | {"config.json": json.dumps(QWEN).encode()})


def test_a_complete_import_is_checked_again_on_its_own_config_without_the_source(s3_job, prefix):
    """maxModelLen raised after the import: the rerun (a new Job) reads the copy's config.json."""
    job, files = s3_job
    job.server.client().put_object(Bucket=BUCKET, Key=f"{SRC}/{prefix}/config.json", Body=json.dumps(QWEN).encode())
    assert job.run(WARMSTART_MAX_MODEL_LEN="32768").returncode == 0
    before = objects(job.server, BUCKET, f"{DST}/{prefix}")
    client = job.server.client()
    for name in list(objects(job.server, BUCKET, f"{SRC}/{prefix}")):
        client.delete_object(Bucket=BUCKET, Key=f"{SRC}/{prefix}/{name}")
    run = job.run(WARMSTART_MAX_MODEL_LEN="65536")
    assert run.returncode == weights_import_settings.EXIT_CONFIG and run.phases == [("check", "error")]
    assert "models[].maxModelLen is 65,536" in run.reason and "at most 32,768" in run.reason
    assert objects(job.server, BUCKET, f"{DST}/{prefix}") == before
    assert job.run(WARMSTART_MAX_MODEL_LEN="32768").phases == [("check", "complete"), ("done", "unchanged")]


def test_hub_import_refuses_it_before_downloading_any_weight(hub_job, hub, prefix):
    job, files = hub_job
    hub.add("org/model", COMMIT, files | {"config.json": json.dumps(LLAMA).encode()})
    run = job.run(WARMSTART_MAX_MODEL_LEN="262144")
    assert run.returncode == weights_import_settings.EXIT_CONFIG, (run.stdout, run.stderr)
    assert run.phases[-1] == ("plan", "error")
    # Llama 3.1's llama3 scaling is already in its 131,072: the fix is only to lower it.
    assert "at most 131,072 tokens (max_position_embeddings with its llama3 RoPE scaling" in run.reason
    assert "--hf-overrides" not in run.reason
    assert not [p for p in hub.downloads() if p.endswith(".safetensors")]
    assert objects(job.server, "models", prefix) == {}
    ok = job.run(WARMSTART_MAX_MODEL_LEN="131072")
    assert ok.returncode == 0, (ok.stdout, ok.stderr)
    assert ok.phase("plan")["model_max_len"] == 131072
