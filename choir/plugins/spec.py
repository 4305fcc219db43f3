"""SpecPlugin: routes come from `choir/spec/openapi.yaml`, handlers are bound to them by operationId.

A handler is a plain async function marked `@operation("createCompletion")`. At app
construction the plugin looks the operation up in the spec and builds the Litestar route from
it: path, method, success status, summary, tags, and the compatibility rules the operation
lists under `x-choir-rules`, as the active profile (choir/spec/profiles/) defines them, in
`opt["compat"]`. A spec operation without a handler, or a handler the spec does not know, stops
start-up with a message naming it.
"""

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, cached_property
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any, cast

import yaml
from litestar import Request, Router, route
from litestar import Response as LitestarResponse
from litestar.config.app import AppConfig
from litestar.enums import HttpMethod
from litestar.exceptions import ImproperlyConfiguredException
from litestar.handlers import HTTPRouteHandler, WebsocketRouteHandler
from litestar.plugins import InitPlugin
from litestar.types import Empty
from litestar.utils import normalize_path

from choir.core.compat import CompatProfile, OperationCompat

# The spec and its profiles are package data: read through importlib.resources, wherever Choir is installed.
SPEC_DIR: Traversable = files("choir") / "spec"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
_MARK = "__choir_operation__"
_PATH_TYPES = {"string": "str", "integer": "int", "number": "float"}


def operation(*operation_ids: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a handler function as the implementation of a spec operation, or of several (one endpoint under
    several paths, each an operation of its own: /rerank, /v1/rerank, /v2/rerank)."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        setattr(fn, _MARK, operation_ids)
        return fn

    return mark


@dataclass(frozen=True)
class SpecOperation:
    operation_id: str
    path: str
    method: str
    definition: dict[str, Any]

    @property
    def status_code(self) -> int:
        return min(int(code) for code in self.definition.get("responses", {"200": {}}) if str(code).startswith("2"))

    @property
    def litestar_path(self) -> str:
        """The OpenAPI path in Litestar's syntax: `{name}` → `{name:str}`; `{name:path}` where the
        parameter sets `x-choir-allow-slashes` (model ids such as `org/model` contain slashes)."""
        path = self.path
        for param in self.definition.get("parameters", []):
            if param.get("in") == "path":
                kind = "path" if param.get("x-choir-allow-slashes") else _PATH_TYPES[param["schema"]["type"]]
                name = param["name"]
                path = path.replace(f"{{{name}}}", f"{{{name}:{kind}}}")
        return path

    @property
    def rule_names(self) -> list[str]:
        return self.definition.get("x-choir-rules", [])


_SPECS: dict[str, dict[str, Any]] = {}


def load_spec(spec_dir: Traversable = SPEC_DIR) -> dict[str, Any]:
    """The spec, read once per file (a test's copy is a directory of its own)."""
    path = spec_dir / "openapi.yaml"
    if str(path) not in _SPECS:
        try:
            _SPECS[str(path)] = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ImproperlyConfiguredException(f"Cannot read the API spec {path}: {exc}") from None
    return _SPECS[str(path)]


def spec_operations(spec: dict[str, Any]) -> dict[str, SpecOperation]:
    return {
        op["operationId"]: SpecOperation(op["operationId"], path, method, op)
        for path, item in spec.get("paths", {}).items()
        for method, op in item.items()
        if method in METHODS
    }


def content_type_check(media_types: tuple[str, ...]) -> Callable[..., Any]:
    """Refuse a body whose Content-Type the operation's requestBody does not list (415), before the
    body is read. A `before_request` hook, not a guard: Litestar hands each guard a copy of the
    route handler, which cost more than the check."""
    from choir.core.errors import APIError

    async def check(request: Request) -> None:
        # Straight from the ASGI headers: building Litestar's Headers object costs more than the check.
        raw = next((value for name, value in request.scope["headers"] if name == b"content-type"), b"")
        media_type = raw.decode("latin-1").split(";")[0].strip().lower()
        if media_type not in media_types:
            raise APIError(415, f"Content-Type must be {' or '.join(media_types)}, not {media_type or 'missing'}.")

    return check


@dataclass
class SpecConfig:
    spec_dir: Traversable = SPEC_DIR
    compat: str = "sglang"  # the profile in spec_dir/profiles/ whose rules the operations apply

    @cached_property
    def operation_rules(self) -> dict[str, OperationCompat]:
        """Each operation's compat rules, from the profile, decoded once. A bad profile, or an operation
        listing a rule the profile does not set, raises SettingsError (one line, naming the files)."""
        profile = CompatProfile.load(self.spec_dir / "profiles", self.compat)
        spec_file = self.spec_dir / "openapi.yaml"
        return {operation_id: profile.for_operation(op.rule_names, f"{spec_file}: operation {operation_id}")
                for operation_id, op in spec_operations(load_spec(self.spec_dir)).items()}


class SpecPlugin(InitPlugin):
    """Must come after every plugin that contributes `@operation` handlers."""

    __slots__ = ("config",)

    def __init__(self, config: SpecConfig | None = None) -> None:
        self.config = config or SpecConfig()

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        self._check_last(app_config)
        operations = spec_operations(load_spec(self.config.spec_dir))
        rules = self.config.operation_rules
        bound: list[Any] = []
        seen: set[str] = set()
        for handler in app_config.route_handlers:
            operation_ids = getattr(handler, _MARK, None)
            if operation_ids is None:
                if _outside_schema(handler):
                    bound.append(handler)  # e.g. the docs UI's static assets, /v1/realtime
                    continue
                raise ImproperlyConfiguredException(
                    f"Route handler {handler!r} is not bound to a spec operation: mark it with @operation(...).")
            for operation_id in operation_ids:
                if operation_id not in operations:
                    raise ImproperlyConfiguredException(
                        f"Handler {getattr(handler, '__qualname__', handler)!r} implements operation "
                        f"{operation_id!r}, which {self.config.spec_dir / 'openapi.yaml'} does not declare.")
                seen.add(operation_id)
                op = operations[operation_id]
                bound.append(self._route(op, cast(Callable[..., Any], handler), rules[operation_id]))
        missing = sorted(set(operations) - seen)
        if missing:
            raise ImproperlyConfiguredException(
                f"{self.config.spec_dir / 'openapi.yaml'} declares operations with no handler: {', '.join(missing)}.")
        app_config.route_handlers = _one_route_per_path(bound)
        return app_config

    def _check_last(self, app_config: AppConfig) -> None:
        """A plugin after this one could add a handler that nothing binds: Litestar's own come after it."""
        later = app_config.plugins[app_config.plugins.index(self) + 1:]
        others = [type(p).__name__ for p in later
                  if isinstance(p, InitPlugin) and not type(p).__module__.startswith("litestar.")]
        if others:
            raise ImproperlyConfiguredException(
                f"SpecPlugin must be the last plugin (it binds every plugin's handlers to the spec); "
                f"it comes before {', '.join(others)}.")

    def _route(self, op: SpecOperation, fn: Callable[..., Any], compat: OperationCompat) -> Any:
        body_types = tuple(op.definition.get("requestBody", {}).get("content", {}))
        return route(
            op.litestar_path,
            http_method=[HttpMethod(op.method.upper())],
            operation_id=op.operation_id,
            status_code=op.status_code,
            summary=op.definition.get("summary"),
            description=op.definition.get("description"),
            tags=op.definition.get("tags"),
            before_request=content_type_check(body_types) if body_types else None,
            # x-choir-streamed-body: the handler reads the body as it comes and bounds it itself (an upload)
            request_max_body_size=None if op.definition.get("x-choir-streamed-body") else Empty,
            # the error shape of the operation's API family: OpenAI's, or Anthropic's (choir/app/errors.py)
            opt={"compat": compat, "errors": op.definition.get("x-choir-errors", "openai")},
        )(fn)


def _one_route_per_path(handlers: list[Any]) -> list[Any]:
    """A path with several operations (GET and DELETE /v1/responses/{id}) gets its OPTIONS handler first, naming
    them all: Litestar builds a path's OPTIONS answer when its first handler is registered, so its own would
    leave the later methods out of `Allow`."""
    by_path: dict[str, list[str]] = {}
    for handler in handlers:
        if isinstance(handler, HTTPRouteHandler):
            by_path.setdefault(min(handler.paths), []).extend(handler.http_methods)
    options = [_options(path, methods) for path, methods in by_path.items() if len(methods) > 1]
    return [*options, *handlers]


def _options(path: str, methods: list[str]) -> HTTPRouteHandler:
    allow = ", ".join(sorted({*methods, "OPTIONS"}))

    def options_handler() -> LitestarResponse[None]:
        return LitestarResponse(content=None, status_code=204, headers={"Allow": allow})

    return route(path, http_method=[HttpMethod.OPTIONS], include_in_schema=False, sync_to_thread=False,
                 opt={"compat": OperationCompat()})(options_handler)


def routed_path(scope: Any) -> str:
    """A request's path as the router normalised it (its root path off), for a request no route matched."""
    path = scope["path"]
    if root := scope.get("root_path", ""):
        path = path.split(root, maxsplit=1)[-1]  # as the router does
    return normalize_path(path)


@cache
def error_shapes(spec_dir: Traversable = SPEC_DIR) -> dict[str, str]:
    """The paths whose operations answer errors in another API's shape (`x-choir-errors`): also a wrong method
    on them, which no operation handles."""
    return {op.path: op.definition["x-choir-errors"] for op in spec_operations(load_spec(spec_dir)).values()
            if "x-choir-errors" in op.definition}


def operation_compat(request: Request) -> OperationCompat:
    """The compatibility rules of the operation this request was routed to."""
    return request.scope["route_handler"].opt["compat"]  # the scope's own: `request.route_handler` costs three calls


def _outside_schema(handler: Any) -> bool:
    if isinstance(handler, Router):
        return all(_outside_schema(h) for route in handler.routes for h in getattr(route, "route_handlers", ()))
    if isinstance(handler, WebsocketRouteHandler):  # OpenAPI describes no websockets (/v1/realtime)
        return True
    # Routers pass it on to handlers that leave it unset (Empty); only False opts out.
    return isinstance(handler, HTTPRouteHandler) and handler.include_in_schema is not True
