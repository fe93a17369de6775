"""The suite's external tools (tests/support/tools.py): found in one cache, never installed by a test;
missing, they skip with the install command, or fail where CI requires them."""

from __future__ import annotations

import re

import pytest

from tests.support import tools
from tests.support.stacks import ROOT


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


# --------------------------------------------------------------------------------------
# Fetching promtool: by name through apt, as the machine configures it


def _deb_with_promtool(body: bytes) -> bytes:
    """A minimal .deb: an `ar` archive whose data.tar.xz holds ./usr/bin/promtool."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        info = tarfile.TarInfo(tools.PROMTOOL_MEMBER)
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    data = buf.getvalue()
    out = b"!<arch>\n"
    for name, payload in ((b"debian-binary", b"2.0\n"), (b"data.tar.xz", data)):
        out += name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) + b"0".ljust(6) + b"100644".ljust(8)
        out += str(len(payload)).encode().ljust(10) + b"`\n" + payload + (b"\n" if len(payload) % 2 else b"")
    return out


class FakeApt:
    """Stands in for tools._run: answers apt-cache/apt-get as apt would, records each call."""

    def __init__(self, deb: bytes, known: bool):
        self.deb, self.known, self.calls = deb, known, []

    def __call__(self, cmd, cwd=None):
        import subprocess

        self.calls.append((cmd, cwd))
        if cmd[:2] == ["apt-cache", "show"]:
            return subprocess.CompletedProcess(cmd, 0 if self.known else 100, "", "")
        if cmd == ["apt-get", "update"]:
            self.known = True
            return subprocess.CompletedProcess(cmd, 0, "", "")
        if cmd[:2] == ["apt-get", "download"] and self.known:
            package, version = cmd[2].split("=")
            (cwd / f"{package}_{version}_amd64.deb").write_bytes(self.deb)
            return subprocess.CompletedProcess(cmd, 0, "", "")
        return subprocess.CompletedProcess(cmd, 100, "", f"E: cannot do {cmd}")


@pytest.fixture
def with_apt(empty_cache, tmp_path, monkeypatch):
    """apt-get on PATH (an executable file; the calls go to FakeApt)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("apt-get", "apt-cache"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    return empty_cache


@pytest.mark.parametrize("known", [True, False], ids=["known", "needs-update"])
def test_promtool_is_fetched_by_name_through_apt_and_its_sha256_checked(with_apt, monkeypatch, known):
    import hashlib

    deb = _deb_with_promtool(b"#!/bin/sh\necho promtool\n")
    apt = FakeApt(deb, known=known)
    monkeypatch.setattr(tools, "_run", apt)
    monkeypatch.setattr(tools, "DEB_SHA256", hashlib.sha256(deb).hexdigest())
    binary = tools.install_promtool()
    assert binary == with_apt / f"promtool-{tools.PROMTOOL_VERSION}"
    assert binary.read_bytes() == b"#!/bin/sh\necho promtool\n" and binary.stat().st_mode & 0o100
    commands = [c for c, _ in apt.calls]
    assert ["apt-get", "download", f"prometheus={tools.PROMTOOL_VERSION}"] in commands
    assert (["apt-get", "update"] in commands) is (not known), "apt-get update only when apt lacks the version"
    (download_cwd,) = [cwd for c, cwd in apt.calls if c[:2] == ["apt-get", "download"]]
    assert download_cwd != with_apt and not download_cwd.exists(), "downloaded in a temporary folder, removed"
    # A second run keeps what is installed and asks apt nothing.
    apt.calls.clear()
    assert tools.install_promtool() == binary and apt.calls == []


def test_a_deb_whose_sha256_is_not_the_pinned_one_is_refused_and_removed(with_apt, monkeypatch):
    monkeypatch.setattr(tools, "_run", FakeApt(_deb_with_promtool(b"other"), known=True))
    with pytest.raises(ValueError, match="not the pinned"):
        tools.install_promtool()
    assert tools.promtool() is None
    assert not list(with_apt.glob("*.deb")), "a refused .deb is not kept for the next run"


def test_without_apt_get_promtool_skips_naming_what_installs_it(empty_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(tools.Unavailable, match="no apt-get"):
        tools.install_promtool()
    command = f"apt-get download prometheus={tools.PROMTOOL_VERSION}"
    with pytest.raises(pytest.skip.Exception, match=re.escape(command)):
        tools.require("promtool")
    monkeypatch.setenv(tools.REQUIRED_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=re.escape(command)):
        tools.require("promtool")


# --------------------------------------------------------------------------------------
# torch: by name through pip as configured; another index only when asked


def test_torch_is_installed_by_name_and_an_index_only_on_request():
    from tests import install

    pin = install.torch_requirement()
    assert install.torch_install_args({}) == ["--no-deps", pin]
    assert install.torch_install_args({"TORCH_INDEX_URL": " "}) == ["--no-deps", pin]
    mirror = "https://mirror.example.internal/torch-cpu"
    assert install.torch_install_args({"TORCH_INDEX_URL": mirror}) == ["--no-deps", pin, "--index-url", mirror]


def test_install_goes_on_when_a_tool_cannot_be_installed_here(monkeypatch, capsys):
    """Without apt-get, tests.install installs the rest and says why promtool is missing (its
    tests then skip, or fail under WARMSTART_TOOLS_REQUIRED), instead of stopping with a traceback."""
    from tests import install

    pip_calls = []
    monkeypatch.setattr(install, "_pip", lambda *args: pip_calls.append(args))

    def unavailable():
        raise tools.Unavailable("promtool comes from Debian's `prometheus` package and this machine has no apt-get")

    monkeypatch.setattr(tools, "INSTALL", {"checkov": lambda: "/cache/checkov", "promtool": unavailable})
    install.main()
    out = capsys.readouterr().out
    assert "checkov: /cache/checkov" in out
    assert "promtool: not installed: promtool comes from Debian's `prometheus` package" in out
    assert pip_calls[0] == tuple(install.torch_install_args())
