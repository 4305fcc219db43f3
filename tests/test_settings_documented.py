"""One source for every setting: each `CHOIR_*` variable Choir reads (a literal in choir/, and each pooling role's
three) is declared in choir/core/variables.py, and only those; a declared default is what Settings does without the
variable; `.env.example` and the settings reference are what `python -m choir.cli.reference` writes from them."""

import re
from pathlib import Path

import pytest

from choir.cli import reference
from choir.core.settings import POOLING_ROLES, Settings
from choir.core.variables import VARIABLES

ROOT = Path(__file__).resolve().parents[1]
DECLARATIONS = ROOT / "choir" / "core" / "variables.py"
ROLE_SETTINGS = ("MODEL", "MODEL_NAME", "ENGINE_ARGS")
# Read elsewhere than Settings: the vLLM version check reads its own.
NOT_SETTINGS = {"CHOIR_ALLOW_VLLM_VERSION"}


def read_by_choir() -> set[str]:
    quoted = {match for path in (ROOT / "choir").rglob("*.py") if path != DECLARATIONS
              for match in re.findall(r"[\"'](CHOIR_[A-Z][A-Z_]*[A-Z])[\"']", path.read_text())}
    return quoted | {role.variable(what) for role in POOLING_ROLES for what in ROLE_SETTINGS}


def test_every_variable_read_is_declared_and_only_those():
    assert set(VARIABLES) ^ read_by_choir() == set()


def test_what_is_read_is_found():
    assert {"CHOIR_MODEL", "CHOIR_API_KEY", "CHOIR_EMBEDDING_MODEL_NAME", "CHOIR_ALLOW_VLLM_VERSION"} <= read_by_choir()


@pytest.mark.parametrize("path, render", [(reference.ENV_EXAMPLE, reference.env_example),
                                          (reference.SETTINGS_PAGE, reference.settings_page)])
def test_the_files_are_written_from_the_declarations(path, render):
    assert (ROOT / path).read_text() == render(), f"{path} is stale: run `python -m choir.cli.reference`"


def test_the_reference_names_every_variable_and_its_option():
    page = (ROOT / reference.SETTINGS_PAGE).read_text()
    for name in VARIABLES:
        assert f"| `{name}` |" in page
    assert "| `CHOIR_MAX_N` | `--max-n` | `128` |" in page
    assert "`--served-model-name`" in page and "`--disable-fastapi-docs`" in page


@pytest.mark.parametrize("name", sorted(name for name, variable in VARIABLES.items()
                                        if variable.default and name not in NOT_SETTINGS))
def test_a_declared_default_is_what_settings_does_without_it(name, tmp_path):
    no_env_file = tmp_path / "absent.env"
    assert Settings.from_env({name: VARIABLES[name].default}, no_env_file) == Settings.from_env({}, no_env_file)


def test_a_default_that_differs_is_caught(tmp_path):
    no_env_file = tmp_path / "absent.env"
    assert Settings.from_env({"CHOIR_MAX_N": "127"}, no_env_file) != Settings.from_env({}, no_env_file)

