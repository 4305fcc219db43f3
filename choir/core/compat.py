"""Compatibility profiles: the rules of choir/spec/profiles/<name>.yaml, decoded at start-up into typed
`Rules` and applied generically.

A rule is data; code here only knows how to apply each kind of rule. A profile with a rule or a
value it does not know (`greedy_n: rejct`) stops start-up with one line naming the file and the
key. SpecPlugin hands every route the `OperationCompat` holding the rules its operation lists under
`x-choir-rules`. The shaping of chat messages and deltas (`delta_always`, `reasoning_field`) is done
here too, in one place.
"""

import hashlib
import typing
from dataclasses import dataclass, field
from functools import cache, cached_property
from importlib.resources.abc import Traversable
from typing import Annotated, Any, Literal, TypeVar

import msgspec
import structlog
import yaml
from msgspec import UNSET, Meta

from choir.core.errors import APIError, bad_request
from choir.core.protocol import parse_strict
from choir.core.protocol.chat import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    Delta,
)
from choir.core.protocol.common import SGLANG_FIELDS
from choir.core.protocol.completions import CompletionChoice
from choir.core.settings import SettingsError

GREEDY_TEMPERATURE = 1e-5  # below this vLLM samples greedily
log = structlog.get_logger("choir.compat")
# The delta keys a profile may make always present: those whose wire type is a string or null.
DeltaKey = Literal["content", "reasoning_content", "reasoning"]
_NONE: dict[str, Any] = {}
OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool")
T = TypeVar("T")
NULLABLE_TYPES: dict[str, type] = {wire_type.__name__: wire_type for wire_type in (
    CompletionChoice, ChatChoice, ChatCompletionResponse, ChatChunkChoice, ChatCompletionChunk)}


class UnknownModel(msgspec.Struct, forbid_unknown_fields=True):
    """The answer to a `model` the server does not serve ({model}: the name sent, {served}: the served names)."""

    status: Annotated[int, Meta(ge=400, le=499)]
    message: str

    def __post_init__(self) -> None:
        try:
            self.message.format(model="", served="")
        except (KeyError, IndexError, ValueError) as exc:  # msgspec reports it at this rule's key
            raise ValueError(f"message may use only the placeholders {{model}} and {{served}} (found {exc})") \
                from None


class Rules(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Every rule a profile may set; None where a profile leaves it to the profile it extends."""

    system_fingerprint: Literal["omit", "include"] | None = None
    delta_always: dict[DeltaKey, str | None] | None = None  # keys every chat delta carries, with their value
    reasoning_field: Literal["reasoning_content", "reasoning"] | None = None
    rejected_fields: dict[str, str] | None = None  # request field → why it is refused
    removed_fields: dict[str, str] | None = None
    unknown_fields: Literal["ignore", "reject"] | None = None
    unknown_model: UnknownModel | None = None
    greedy_n: Literal["allow", "reject"] | None = None
    # SGLang's own request fields (regex, ebnf, no_stop_trim, ...): `honour` them as SGLang does, or
    # `ignore` them as any other unknown field (as vLLM's server does).
    sglang_fields: Literal["honour", "ignore"] | None = None
    # Chat message roles: `openai` (system, developer, user, assistant, tool; others a 400) or `any`
    # (a custom role reaches the chat template as it is, as in vLLM's server).
    message_roles: Literal["openai", "any"] | None = None
    # The event that ends a Responses stream cut short (max_output_tokens): OpenAI's own, or, as vLLM's
    # server sends it, response.completed carrying status "incomplete".
    incomplete_response_event: Literal["response.incomplete", "response.completed"] | None = None
    # Fields sent as null when they carry nothing (vLLM's server sends every field of its models), by wire
    # type: {"CompletionChoice": ["token_ids", ...]}. Without the rule they are left out.
    null_fields: dict[str, list[str]] | None = None
    # A completions prompt given as token ids, echoed: `keep` its special tokens (`<s>The capital`, as vLLM)
    # or `skip` them (`The capital`, as SGLang). A text prompt is echoed as it was sent.
    echo_special_tokens: Literal["keep", "skip"] | None = None
    # GET /v1/models' `root` for a served name: the model's `path` (vLLM) or the `served_name` (SGLang).
    model_root: Literal["path", "served_name"] | None = None
    # Request values of another JSON type: `strict` (`"n": "2"` is a 400: a client bug shows at once) or
    # `lax` (converted where the text says a value of the field's type, `"true"`, `"2"`, as pydantic does).
    type_coercion: Literal["strict", "lax"] | None = None

    def __post_init__(self) -> None:
        for type_name, names in (self.null_fields or {}).items():
            wire_type = NULLABLE_TYPES.get(type_name)
            if wire_type is None:
                raise ValueError(f"{type_name!r} is not a response type ({', '.join(NULLABLE_TYPES)})")
            nullable = {field.name for field in msgspec.structs.fields(wire_type)
                        if field.default is UNSET and _allows_none(field.type)}
            unknown = sorted(set(names) - nullable)
            if unknown:
                raise ValueError(f"{type_name} has no optional field {', '.join(unknown)} that may be null "
                                 f"(those: {', '.join(sorted(nullable))})")


def _allows_none(annotation: Any) -> bool:
    return type(None) in typing.get_args(annotation)


RULE_NAMES = frozenset(field.name for field in msgspec.structs.fields(Rules))


class ProfileFile(msgspec.Struct, forbid_unknown_fields=True):
    rules: Rules = msgspec.field(default_factory=Rules)
    extends: str | None = None


@dataclass(frozen=True)
class CompatProfile:
    name: str
    rules: Rules
    source: Traversable | None = None  # its file

    @classmethod
    def load(cls, profiles_dir: Traversable, name: str) -> "CompatProfile":
        """`profiles_dir`: the package's own (choir/spec/profiles, package data) or any directory."""
        known = sorted(path.name.removesuffix(".yaml") for path in profiles_dir.iterdir()
                       if path.name.endswith(".yaml"))
        if name not in known:
            raise SettingsError(f"CHOIR_COMPAT={name!r} is not a known profile: {', '.join(known)}.")
        chain: list[Rules] = []
        seen: list[str] = []
        current: str | None = name
        while current is not None:
            if current in seen or current not in known:
                raise SettingsError(f"Profile {name!r} extends {current!r}, which is unknown or circular.")
            seen.append(current)
            document = _read(profiles_dir / f"{current}.yaml")
            chain.append(document.rules)
            current = document.extends
        merged = {rule: next((getattr(rules, rule) for rules in chain if getattr(rules, rule) is not None), None)
                  for rule in RULE_NAMES}  # the more specific profile wins, rule by rule
        return cls(name, Rules(**merged), profiles_dir / f"{name}.yaml")

    def for_operation(self, rule_names: list[str], where: str = "an operation") -> "OperationCompat":
        """The rules `where` lists (under `x-choir-rules`); each must be one this profile defines."""
        unknown = sorted(name for name in rule_names if name not in RULE_NAMES)
        if unknown:
            raise SettingsError(f"{where}: x-choir-rules names no known rule: {', '.join(unknown)} "
                                f"(the rules: {', '.join(sorted(RULE_NAMES))}).")
        undefined = sorted(name for name in rule_names if getattr(self.rules, name) is None)
        if undefined:
            raise SettingsError(f"{where}: x-choir-rules lists {', '.join(undefined)}, which profile {self.name!r} "
                                f"({self.source or 'its file'}, with what it extends) does not set.")
        return OperationCompat(Rules(**{name: getattr(self.rules, name) for name in rule_names}))


def _read(path: Traversable) -> ProfileFile:
    try:
        document = yaml.safe_load(path.read_text()) or {}
        return msgspec.convert(document, ProfileFile, strict=True)
    except yaml.YAMLError as exc:
        raise SettingsError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).partition(" - at `$.")
        key = where.rstrip("`") or "the document"
        raise SettingsError(f"{path}: {key}: {message}") from None


@dataclass(frozen=True)
class OperationCompat:
    """The profile's rules that apply to one operation; a rule it does not list is not applied."""

    rules: Rules = field(default_factory=Rules)

    def admit(self, body: Any, wire_type: type[T]) -> T:
        """The request body as its wire type, once the rules admit it: strictly (`"n": "2"` is an error)
        unless the profile's `type_coercion` is lax."""
        body = self.check_body(body, wire_type)
        if self.rules.type_coercion == "lax":
            return msgspec.convert(body, wire_type, strict=False)
        return parse_strict(body, wire_type)

    def check_body(self, body: Any, wire_type: type) -> Any:
        """Fields the profile refuses, then fields the endpoint does not know: ignored with a warning
        that names them (as vLLM's server does), or refused (`unknown_fields: reject`). The body to
        parse: without SGLang's fields where the profile ignores them."""
        if not isinstance(body, dict):
            return body  # not an object: parsing reports it
        for refused in (self.rules.rejected_fields, self.rules.removed_fields):
            for name, message in (refused or {}).items():
                if name in body:
                    raise bad_request(message, name)
        ignore_sglang = self.rules.sglang_fields == "ignore"
        known = known_fields(wire_type, ignore_sglang)
        if self.rules.sglang_fields == "honour" and "response_format" in body:
            body = _sglang_response_format(body)
        unknown = [name for name in body if name not in known]
        if not unknown or self.rules.unknown_fields is None:
            return body
        if self.rules.unknown_fields == "reject":
            names = ", ".join(f"`{name}`" for name in unknown)
            raise bad_request(f"Unknown field{'s' if len(unknown) > 1 else ''} {names}: this endpoint does not take "
                              f"{'them' if len(unknown) > 1 else 'it'}. See GET /schema for its fields.", unknown[0])
        log.warning("request fields ignored: this endpoint does not know them", fields=unknown)
        if ignore_sglang and not SGLANG_FIELDS.isdisjoint(body):
            return {name: value for name, value in body.items() if name not in SGLANG_FIELDS}
        return body

    def check_roles(self, roles: list[str], param: str = "messages") -> None:
        """Under `message_roles: openai`, a role OpenAI does not define is a 400 naming the message."""
        if self.rules.message_roles != "openai":
            return
        for index, role in enumerate(roles):
            if role not in OPENAI_ROLES:
                raise bad_request(f"Invalid role `{role}`: a message's role is one of {', '.join(OPENAI_ROLES)}.",
                                  f"{param}[{index}].role")

    def check_model(self, model: str | None, served: tuple[str, ...]) -> None:
        rule = self.rules.unknown_model
        if rule is None or model is None or model in served:
            return
        raise APIError(rule.status, rule.message.format(model=model, served=", ".join(served)), "model")

    def check_n(self, n: int, temperature: float | None) -> None:
        if self.rules.greedy_n == "reject" and n > 1 and temperature is not None and \
                temperature < GREEDY_TEMPERATURE:
            raise bad_request(f"n must be 1 when using greedy sampling, got {n}.", "n")

    def system_fingerprint(self, engine_name: str, engine_version: str, model_root: str,
                           max_model_len: int) -> str | None:
        """`{engine}-{version}-{digest of the model and its context length}`, e.g. vllm-0.32.0-1a2b3c4d."""
        if self.rules.system_fingerprint != "include":
            return None
        digest = hashlib.sha256(f"{model_root}|{max_model_len}".encode()).hexdigest()[:8]
        return f"{engine_name}-{engine_version}-{digest}"

    # The shaping of chat answers: where reasoning goes, and what every delta carries.

    @property
    def reasoning_field(self) -> str:
        return self.rules.reasoning_field or "reasoning_content"

    def message(self, content: str | None, tool_calls: list[Any], reasoning: str | None,
                reads_reasoning: bool, role: str = "assistant") -> AssistantMessage:
        """A whole answer's message. A choice with a reasoning parser carries the reasoning field
        (null when there was none); one without does not."""
        message = AssistantMessage(role=role, content=content, tool_calls=tool_calls or UNSET)
        if reads_reasoning:
            setattr(message, self.reasoning_field, reasoning)
        return message

    def nulls(self, wire_type: type) -> dict[str, Any]:
        """The fields of `wire_type` to send as null unless set (the profile's `null_fields`)."""
        return self._nulls.get(wire_type.__name__, _NONE)

    @cached_property
    def _nulls(self) -> dict[str, dict[str, Any]]:
        return {name: dict.fromkeys(fields) for name, fields in (self.rules.null_fields or {}).items()}

    @cached_property
    def _always(self) -> dict[str, Any]:
        return {str(key): value for key, value in (self.rules.delta_always or {}).items()}

    def delta(self, fields: dict[str, Any], content: str | None = None, reasoning: str | None = None,
              tool_calls: list[Any] | None = None) -> Delta:
        """A stream chunk's delta: `fields`, the parts that are set, and the profile's `delta_always` keys."""
        values = {**self._always, **fields}
        if content:
            values["content"] = content
        if reasoning:
            values[self.reasoning_field] = reasoning
        if tool_calls:
            values["tool_calls"] = tool_calls
        return Delta(**values)


def _sglang_response_format(body: dict[str, Any]) -> dict[str, Any]:
    """SGLang takes a json_schema response format with its schema beside `type` (as the Responses API
    writes it) and wraps it as chat's `json_schema`."""
    response_format = body.get("response_format")
    if not (isinstance(response_format, dict) and response_format.get("type") == "json_schema"
            and "schema" in response_format and "json_schema" not in response_format):
        return body
    schema = response_format["schema"]
    name = schema.get("title", "Schema") if isinstance(schema, dict) else "Schema"
    wrapped = {"name": name, "schema": schema, **({"strict": response_format["strict"]}
                                                  if "strict" in response_format else {})}
    return {**body, "response_format": {"type": "json_schema", "json_schema": wrapped}}


@cache
def known_fields(wire_type: type, without_sglang: bool = False) -> frozenset[str]:
    known = frozenset(field.encode_name for field in msgspec.structs.fields(wire_type))
    return known - SGLANG_FIELDS if without_sglang else known
