"""The documentation builds: MkDocs in strict mode (a broken link or anchor, a page left out of the navigation
fails), with no network (no web fonts; search from disk through the offline plugin); the README is a front page
whose links all lead somewhere."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README_LIMIT = 12 * 1024


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                            capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    return out


def nav_pages(nav) -> list[str]:
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_page_is_built_and_in_the_navigation(site):
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    pages = nav_pages(config["nav"])
    written = {str(path.relative_to(ROOT / "docs")) for path in (ROOT / "docs").rglob("*.md")}
    assert set(pages) == written
    for page in pages:
        assert (site / page.replace(".md", ".html")).is_file(), page


def test_the_site_works_from_disk(site):
    html = "\n".join(path.read_text() for path in site.rglob("*.html"))
    assert "fonts.googleapis.com" not in html and "fonts.gstatic.com" not in html
    assert (site / "search" / "search_index.js").is_file()  # the offline plugin's: search without a server
    assert 'href="getting-started.html"' in (site / "index.html").read_text()  # file links, no directory URLs


def test_a_broken_link_fails_the_build(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[gone](missing.md)\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text((ROOT / "mkdocs.yml").read_text().split("\nnav:")[0]
                      .replace("docs_dir: docs", f"docs_dir: {docs}") + "\nnav:\n  - Home: index.md\n")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config),
                             "--site-dir", str(tmp_path / "site")], capture_output=True, text=True,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 1 and "missing.md" in result.stderr


def test_the_readme_is_a_front_page_whose_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= README_LIMIT
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    missing = [link for link in local if not (ROOT / link).exists()]
    assert local and not missing, missing
    assert "make serve" in readme and "make test" in readme and "from openai import OpenAI" in readme
