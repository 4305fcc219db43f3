"""The documentation's examples run: every Python block of the pages below, against the real server serving what
docs/models.md starts (the bundled model, its LoRA adapter and the three pooling models). The blocks of one page
run in order in one namespace, as a reader pastes them; the address is the test server's."""

import re
from pathlib import Path

import pytest

from choir.core.settings import BUNDLED_LORA_DIR, bundled_model_dir
from tests.integration.server import start_server

pytestmark = pytest.mark.engine

DOCS = Path(__file__).resolve().parents[2] / "docs"
# Every page with Python examples but docs/images.md (it opens a cat.png of the reader's), index.md (a
# Qwen model) and api/audio.md (a speech model: tests/integration/test_audio.py runs it on the tiny Whisper).
PAGES = ("../README.md", "getting-started.md", "models.md", "api/chat.md", "api/responses.md", "api/messages.md",
         "api/pooling.md", "api/tokenize.md", "api/files.md",
         "api/batches.md")
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("docs") / "server.log", env={
        "CHOIR_LORA_MODULES": f"tiny-lora={BUNDLED_LORA_DIR}", "CHOIR_ENGINE_ARGS": "--max-lora-rank 8",
        **{f"CHOIR_{prefix}_MODEL": str(bundled_model_dir(role))
           for role, prefix in (("embed", "EMBEDDING"), ("rerank", "RERANK"), ("classify", "CLASSIFY"))}})
    yield server
    server.stop()


def test_every_page_with_python_examples_is_run():
    with_examples = {str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md") if BLOCK.search(path.read_text())}
    assert with_examples - set(PAGES) == {"images.md", "index.md", "api/audio.md"}


@pytest.mark.parametrize("page", PAGES)
def test_the_pages_examples_run(server, page, capsys):
    blocks = BLOCK.findall((DOCS / page).read_text())
    assert blocks, f"{page} has no Python example"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block.replace("http://127.0.0.1:8000", server.base_url), f"{page} example", "exec"), namespace)
    assert capsys.readouterr().out.strip()  # each page's examples print what they got
