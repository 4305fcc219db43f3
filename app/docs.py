"""OpenAPI config and a docs UI that works offline: Swagger UI's files are served by Choir itself."""

from typing import Any

from litestar import Router
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.static_files import create_static_files_router
from swagger_ui_bundle import swagger_ui_path

ASSETS = "/schema/assets"


def openapi_config(spec: dict[str, Any]) -> OpenAPIConfig:
    info = spec.get("info", {})
    swagger = SwaggerRenderPlugin(
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
        render_plugins=[swagger],
        create_examples=False,
    )


def docs_assets_router() -> Router:
    return create_static_files_router(path=ASSETS, directories=[str(swagger_ui_path)], include_in_schema=False)
