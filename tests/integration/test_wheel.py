"""Choir as a package: the wheel holds one import package, `choir`, with its spec and profiles; installed (not
editable) into a fresh virtual environment outside the checkout, `choir serve MODEL` serves the bundled tiny model
to the OpenAI SDK: a chat, a stream and `n = 2`.

The fresh environment takes Choir's dependencies (vLLM, torch: gigabytes) from the checkout's environment through
a .pth file, the way a system site-packages would be seen, and `pip check` shows the wheel's requirements are met
there; Choir itself comes only from the wheel."""

import os
import signal
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import httpx
import openai
import pytest

from choir.core.settings import BUNDLED_MODEL_DIR
from tests.integration.server import ROOT, Server, free_port, healthy

pytestmark = pytest.mark.engine


def run(*command: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run([str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, f"{command}: {result.stdout[-3000:]}{result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # The build backend from this environment (setuptools, as pyproject's [build-system] asks): no download.
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", out, ROOT, cwd=out)
    (built,) = out.glob("choir-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory) -> Path:
    """A fresh virtual environment outside the checkout with the wheel installed in it; its bin/."""
    venv = tmp_path_factory.mktemp("venv")
    run(sys.executable, "-m", "venv", venv, cwd=venv)
    python = venv / "bin" / "python"
    run(python, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", wheel, cwd=venv)
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=venv).strip())
    (site / "choir-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin"


# The wheel's own requirements and its `cpu` extra's, each checked against what is installed (pip check would also
# judge vLLM's optional torchvision, which the CPU build leaves out on purpose).
UNMET = """
from importlib.metadata import PackageNotFoundError, requires, version
from packaging.requirements import Requirement
unmet = []
for line in requires("choir"):
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": "cpu"}):
        continue
    try:
        found = version(req.name)
    except PackageNotFoundError:
        found = None
    if found is None or not req.specifier.contains(found, prereleases=True):
        unmet.append(f"{req} ({found})")
print(unmet)
"""


def test_the_wheel_holds_one_package_with_its_data(wheel: Path):
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"choir"}
    for data in ("choir/spec/openapi.yaml", "choir/spec/profiles/sglang.yaml", "choir/spec/profiles/vllm.yaml",
                 "choir/plugins/store/migrations/script.py.mako"):
        assert data in names
    entry_points = next(name for name in names if name.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "choir = choir.cli.main:main" in text and "choir_cpu_amx_fix = choir.engine.vllm.cpu_amx_fix" in text


def test_installed_outside_the_checkout_it_imports_from_the_wheel(installed: Path, tmp_path):
    where = run(installed / "python", "-c", "import choir; print(choir.__file__)", cwd=tmp_path).strip()
    assert where.startswith(str(installed.parent)) and not where.startswith(str(ROOT))
    unmet = run(installed / "python", "-c", UNMET, cwd=tmp_path).strip()
    assert unmet == "[]", f"the wheel's requirements (choir[cpu]) that the environment lacks: {unmet}"
    from importlib.metadata import version

    assert run(installed / "choir", "--version", cwd=tmp_path).strip() == f"choir {version('choir')}"


def test_choir_serve_from_the_wheel_answers_the_openai_sdk(installed: Path, tmp_path):
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["VLLM_HOST_IP"] = "127.0.0.1"
    log = tmp_path / "server.log"
    process = subprocess.Popen([installed / "choir", "serve", str(BUNDLED_MODEL_DIR), "--host", "127.0.0.1",
                                "--port", str(port), "--api-key", "wheel-key"], cwd=tmp_path, env=env,
                               stdout=log.open("w"), stderr=subprocess.STDOUT)
    server = healthy(Server(process, f"http://127.0.0.1:{port}", log))
    try:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="wheel-key", max_retries=0, timeout=120)
        messages = [{"role": "user", "content": "Hello from a wheel"}]
        chat = client.chat.completions.create(model="choir-tiny", messages=messages, max_tokens=5)
        assert chat.choices[0].message.content and chat.usage.completion_tokens == 5
        stream = client.chat.completions.create(model="choir-tiny", messages=messages, max_tokens=5, stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        assert text
        two = client.chat.completions.create(model="choir-tiny", messages=messages, max_tokens=4, n=2, seed=7)
        assert [choice.index for choice in two.choices] == [0, 1]
        from importlib.metadata import version

        assert httpx.get(f"{server.base_url}/version").json()["version"] == version("choir")
        # The store defaulted to the directory it started in, not to the checkout.
        assert (tmp_path / ".choir" / "store.sqlite3").exists()
    finally:
        # uvicorn exits by the SIGTERM it caught, once the engine has stopped; stop() checks no process is left
        assert server.stop() in (0, -signal.SIGTERM)
