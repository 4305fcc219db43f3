"""Choir: an OpenAI-compatible front end for vLLM (Litestar over vLLM's AsyncLLM).

The data path, package by package (docs/architecture.md): `spec/` (the API, package data) → `app/` (routes,
serving) → `plugins/` (spec binding, auth, fan-out, aggregation, the store, the engines' lifecycle) →
`engine/` (the seam; vLLM's adapter behind it in `engine/vllm/`) → `core/` (settings, wire types, errors).
`cli/` is the `choir` command; `tiny/` builds the tiny models Choir is tested on."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("choir")
except PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "0+unknown"
