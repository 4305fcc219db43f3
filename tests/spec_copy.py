"""A copy of choir/spec/ with some of its documents edited: for tests that change the spec, not the code."""

import shutil
from collections.abc import Callable
from pathlib import Path

import yaml

from choir.plugins.spec import SPEC_DIR


def spec_copy(tmp_path: Path, **edits: Callable[[dict], None]) -> Path:
    """`edits` maps a document to an edit of it: `openapi=...`, `profiles__sglang=...`."""
    target = tmp_path / "spec"
    shutil.copytree(SPEC_DIR, target)
    for name, edit in edits.items():
        path = target / (name.replace("__", "/") + ".yaml")
        document = yaml.safe_load(path.read_text())
        edit(document)
        path.write_text(yaml.safe_dump(document))
    return target
