"""The suite's external tools (tests/support/tools.py): found in one cache, never installed by a test;
missing, they skip with the install command, or fail where CI requires them."""

from __future__ import annotations

import re

import pytest

from tests.support import tools
from tests.conftest import ROOT


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMSTART_TOOLS_CACHE", str(tmp_path))
    monkeypatch.delenv("WARMSTART_CHECKOV", raising=False)
    monkeypatch.delenv(tools.REQUIRED_ENV, raising=False)
    return tmp_path


@pytest.mark.parametrize("name", sorted(tools.WHERE))
def test_a_missing_tool_skips_naming_the_install_command(empty_cache, name):
    with pytest.raises(pytest.skip.Exception, match=re.escape(f"run `{tools.INSTALL_COMMAND}`")):
        tools.require(name)
    assert not any(empty_cache.iterdir()), "looking for a tool never installs it"


@pytest.mark.parametrize("name", sorted(tools.WHERE))
def test_where_ci_requires_the_tools_a_missing_one_fails(empty_cache, monkeypatch, name):
    monkeypatch.setenv(tools.REQUIRED_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=name):
        tools.require(name)


def test_one_cache_variable_serves_every_tool(empty_cache):
    """Both tools are looked up in WARMSTART_TOOLS_CACHE (they once read two variables)."""
    checkov_venv = empty_cache / f"checkov-{tools.CHECKOV_VERSION}"
    (checkov_venv / "bin").mkdir(parents=True)
    (checkov_venv / "bin" / "checkov").write_text("")
    assert tools.WHERE["checkov"]() is None, "no marker: an install that died half-way is not used"
    (checkov_venv / ".installed").write_text("")
    (empty_cache / f"promtool-{tools.PROMTOOL_VERSION}").write_text("")
    assert {name: tools.require(name).parent.parent if name == "checkov" else tools.require(name).parent
            for name in tools.WHERE} == {"checkov": checkov_venv, "promtool": empty_cache}


def test_ci_installs_every_tool_before_pytest_and_requires_them():
    commands = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if not line.startswith("#")]
    assert f"export {tools.REQUIRED_ENV}=1" in commands
    script = "\n".join(commands)
    assert script.index("-m tests.install") < script.index("-m pytest")
    from tests import install

    assert set(tools.INSTALL) == set(tools.WHERE), "every tool a test can require is installed by tests.install"
    assert install.torch_requirement().startswith("torch==")
