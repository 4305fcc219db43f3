"""Every setting is documented where a user looks for it: each `CHOIR_*` variable Choir reads (a literal in
choir/, and each pooling role's three) is in the README's settings section and in .env.example, and neither names
a variable Choir does not read."""

import re
from pathlib import Path

from choir.core.settings import POOLING_ROLES

ROOT = Path(__file__).resolve().parents[1]
VARIABLE = re.compile(r"CHOIR_[A-Z][A-Z_]*[A-Z]|CHOIR_<ROLE>_[A-Z_]*[A-Z]")
ROLE_SETTINGS = ("MODEL", "MODEL_NAME", "ENGINE_ARGS")


def read_by_choir() -> set[str]:
    quoted = {match for path in (ROOT / "choir").rglob("*.py")
              for match in re.findall(r"[\"'](CHOIR_[A-Z][A-Z_]*[A-Z])[\"']", path.read_text())}
    return quoted | {role.variable(what) for role in POOLING_ROLES for what in ROLE_SETTINGS}


def named(text: str) -> set[str]:
    """The variables a text names; `CHOIR_<ROLE>_X` stands for each pooling role's."""
    found = set()
    for name in VARIABLE.findall(text):
        if "<ROLE>" in name:
            found |= {name.replace("<ROLE>", role.prefix) for role in POOLING_ROLES}
        else:
            found.add(name)
    return found


def test_the_readme_documents_every_setting_and_only_those():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("\n## Settings\n"):]
    section = section[:section.index("\n## ", 1)]
    assert named(section) ^ read_by_choir() == set()


def test_env_example_lists_every_setting_and_only_those():
    listed = {match for match in re.findall(r"^#?\s*(CHOIR_[A-Z_]+)=", (ROOT / ".env.example").read_text(),
                                            re.MULTILINE)}
    assert listed ^ read_by_choir() == set()


def test_what_is_read_is_found():
    assert {"CHOIR_MODEL", "CHOIR_API_KEY", "CHOIR_EMBEDDING_MODEL_NAME", "CHOIR_ALLOW_VLLM_VERSION"} <= read_by_choir()
