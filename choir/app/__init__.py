"""The Litestar application: `create_app` (`litestar --app choir.app:create_app run`, uvicorn's --factory)."""

from choir.app.asgi import create_app

__all__ = ["create_app"]
