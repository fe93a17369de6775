"""`warmstart coldstart`, `coldstart --history`, `wake-bench` and `bench-loader` on a model stack
(docs/model-stacks.md): its config (ModelStackConfig) has no namespace, region or buckets of its
own; they are the platform's, read from the platform contract, as the drill reads them."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from warmstart import cli, render
from warmstart.coldstart import history, reader
from warmstart.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_PREREQUISITES

ROOT = Path(__file__).resolve().parents[2]
STACK = "staging-llama-3-1-8b"


@pytest.fixture(scope="module")
def contract():
    _, plan = render.load_plan(ROOT / "stacks", STACK)
    assert not hasattr(plan.config, "namespace")  # what made these commands crash
    return plan.contract


@pytest.fixture()
def no_pods(monkeypatch):
    """A cluster that answers and holds no pod of the model; records the namespaces asked."""
    asked: list[str] = []
    monkeypatch.setattr(reader, "connect", lambda *a, **k: types.SimpleNamespace())
    monkeypatch.setattr(reader, "model_pods", lambda cluster, ns, model, sel: asked.append(ns) or [])
    monkeypatch.chdir(ROOT)
    return asked


@pytest.mark.parametrize("command, code, says", [
    ("coldstart", EXIT_FAILED, "no pods of model llama-3-1-8b in namespace {ns}"),
    ("wake-bench", EXIT_FAILED, "no sleeping standby pod of llama-3-1-8b in {ns}"),
])
def test_the_cluster_commands_use_the_platforms_namespace(contract, no_pods, capsys, command, code, says):
    assert cli.main([command, "--stack", STACK]) == code
    err = capsys.readouterr().err
    assert says.format(ns=contract.namespace) in err and "Traceback" not in err, err
    assert no_pods == [contract.namespace]


def test_the_history_reads_the_platforms_bucket_in_its_region(contract, monkeypatch, capsys):
    import boto3

    seen = {}
    monkeypatch.setattr(boto3, "client", lambda service, region_name=None, config=None:
                        seen.setdefault("client", (service, region_name)) and types.SimpleNamespace())
    monkeypatch.setattr(history, "read_records", lambda s3, bucket, prefix: seen.setdefault("read", (bucket, prefix))
                        and [])
    monkeypatch.chdir(ROOT)
    assert cli.main(["coldstart", "--stack", STACK, "--history"]) == EXIT_OK, capsys.readouterr().err
    assert seen["client"] == ("s3", contract.region)
    assert seen["read"][0] == contract.compile_cache_bucket


def test_bench_loader_builds_its_job_in_the_platforms_namespace(contract, monkeypatch, capsys):
    from warmstart.manifests import bench_loader as bl

    built = []
    real = bl.bench_loader_job
    monkeypatch.setattr(bl, "bench_loader_job", lambda m, ns, region, **k: built.append((ns, region)) or
                        real(m, ns, region, **k))

    def unreachable(*a, **k):
        raise reader.ReaderError("no cluster here")
    monkeypatch.setattr(reader, "connect", unreachable)
    monkeypatch.chdir(ROOT)
    assert cli.main(["bench-loader", "--stack", STACK]) == EXIT_PREREQUISITES
    assert "no cluster here" in capsys.readouterr().err
    assert built == [(contract.namespace, contract.region)]
