"""Choir: an OpenAI-compatible Litestar front end for vLLM. `litestar run` finds `create_app` here."""

from app.asgi import create_app

__all__ = ["create_app"]
