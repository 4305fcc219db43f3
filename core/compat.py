"""Compatibility profiles: the rules of spec/profiles/<name>.yaml, applied generically.

A rule is data; code here only knows how to apply each kind of rule. SpecPlugin hands every route
the `OperationCompat` holding the rules its operation lists under `x-choir-rules`.
"""

import hashlib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
import structlog
import yaml

from core.errors import APIError, bad_request
from core.settings import SettingsError

GREEDY_TEMPERATURE = 1e-5  # below this vLLM samples greedily
log = structlog.get_logger("choir.compat")


@dataclass(frozen=True)
class CompatProfile:
    name: str
    rules: dict[str, Any]

    @classmethod
    def load(cls, profiles_dir: Path, name: str) -> "CompatProfile":
        known = sorted(path.stem for path in profiles_dir.glob("*.yaml"))
        if name not in known:
            raise SettingsError(f"CHOIR_COMPAT={name!r} is not a known profile: {', '.join(known)}.")
        rules: dict[str, Any] = {}
        chain, current = [], name
        while current is not None:
            if current in chain or current not in known:
                raise SettingsError(f"Profile {name!r} extends {current!r}, which is unknown or circular.")
            chain.append(current)
            document = yaml.safe_load((profiles_dir / f"{current}.yaml").read_text()) or {}
            rules = {**document.get("rules", {}), **rules}  # the more specific profile wins
            current = document.get("extends")
        return cls(name, rules)

    def for_operation(self, rule_names: list[str]) -> "OperationCompat":
        unknown = sorted(set(rule_names) - set(self.rules))
        if unknown:
            raise SettingsError(f"Profile {self.name!r} defines no rule {', '.join(unknown)}.")
        return OperationCompat({name: self.rules[name] for name in rule_names})


@dataclass(frozen=True)
class OperationCompat:
    """The profile's rules that apply to one operation; a rule it does not list is not applied."""

    rules: dict[str, Any] = field(default_factory=dict)

    def check_body(self, body: Any, wire_type: type[msgspec.Struct]) -> None:
        """Fields the profile refuses, then fields the endpoint does not know: ignored with a warning
        that names them (as vLLM's server does), or refused (`unknown_fields: reject`)."""
        if not isinstance(body, dict):
            return  # not an object: parsing reports it
        for rule in ("rejected_fields", "removed_fields"):
            for name, message in (self.rules.get(rule) or {}).items():
                if name in body:
                    raise bad_request(message, name)
        unknown = [name for name in body if name not in known_fields(wire_type)]
        if not unknown:
            return
        if self.rules.get("unknown_fields") == "reject":
            names = ", ".join(f"`{name}`" for name in unknown)
            raise bad_request(f"Unknown field{'s' if len(unknown) > 1 else ''} {names}: this endpoint does not take "
                              f"{'them' if len(unknown) > 1 else 'it'}. See GET /schema for its fields.", unknown[0])
        if "unknown_fields" in self.rules:
            log.warning("request fields ignored: this endpoint does not know them", fields=unknown)

    def check_model(self, model: str | None, served: tuple[str, ...]) -> None:
        rule = self.rules.get("unknown_model")
        if rule is None or model is None or model in served:
            return
        message = rule["message"].format(model=model, served=", ".join(served))
        raise APIError(int(rule["status"]), message, "model")

    def check_n(self, n: int, temperature: float | None) -> None:
        if self.rules.get("greedy_n") == "reject" and n > 1 and temperature is not None and \
                temperature < GREEDY_TEMPERATURE:
            raise bad_request(f"n must be 1 when using greedy sampling, got {n}.", "n")

    def system_fingerprint(self, engine_version: str, model_root: str, max_model_len: int) -> str | None:
        if self.rules.get("system_fingerprint") != "include":
            return None
        digest = hashlib.sha256(f"{model_root}|{max_model_len}".encode()).hexdigest()[:8]
        return f"vllm-{engine_version}-{digest}"

    @property
    def reasoning_field(self) -> str:
        return self.rules.get("reasoning_field") or "reasoning_content"

    @property
    def delta_always(self) -> dict[str, Any]:
        return self.rules.get("delta_always") or {}


@cache
def known_fields(wire_type: type[msgspec.Struct]) -> frozenset[str]:
    return frozenset(field.encode_name for field in msgspec.structs.fields(wire_type))
