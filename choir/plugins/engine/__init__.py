"""The engine plugin: the engines' lifecycle and state keys (config.py), its wiring into the app (plugin.py),
and /health and /version (health.py). The engines themselves are choir/engine/'s."""
