"""The API docs: /schema shows choir/spec/openapi.yaml as written (not a regenerated copy), in a Swagger UI
that works offline because Choir serves Swagger UI's files itself."""

from typing import Any

from litestar import Request, Router
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin, SwaggerRenderPlugin
from litestar.static_files import create_static_files_router
from swagger_ui_bundle import swagger_ui_path

ASSETS = "/schema/assets"


class _SpecSwagger(SwaggerRenderPlugin):
    def __init__(self, spec: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec

    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        return super().render(request, self.spec)


class _SpecJson(JsonRenderPlugin):
    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__()
        self.spec = spec

    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        return super().render(request, self.spec)


def openapi_config(spec: dict[str, Any]) -> OpenAPIConfig:
    info = spec.get("info", {})
    swagger = _SpecSwagger(
        spec,
        path="/",  # the docs page is /schema itself
        js_url=f"{ASSETS}/swagger-ui-bundle.js",
        css_url=f"{ASSETS}/swagger-ui.css",
        standalone_preset_js_url=f"{ASSETS}/swagger-ui-standalone-preset.js",
        favicon=f"<link rel='icon' type='image/png' href='{ASSETS}/favicon-32x32.png'>",
    )
    return OpenAPIConfig(
        title=info.get("title", "Choir"),
        version=info.get("version", "0"),
        description=info.get("description"),
        path="/schema",
        render_plugins=[swagger, _SpecJson(spec)],
        create_examples=False,
    )


def docs_assets_router() -> Router:
    return create_static_files_router(path=ASSETS, directories=[str(swagger_ui_path)], include_in_schema=False)
