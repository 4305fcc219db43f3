"""The lowest layer: settings, wire types, error types and compatibility rules. Plain Python (no web
framework, no engine): choir/plugins/ and choir/app/ build on it, and it imports neither (pyproject's
[tool.importlinter] checks it)."""
