"""The engine plugin: vLLM's AsyncLLM lifecycle (config.py), its wiring (plugin.py), the seam
the HTTP layer talks to (protocol.py), and the vLLM implementation of it (vllm_engine.py)."""
