"""The lowest layer: settings, wire types, error types and compatibility rules. Plain Python (no web
framework, no engine): plugins/ and app/ build on it, and it imports neither (pyproject's
[tool.importlinter] checks it)."""
