"""The engine seam: what the HTTP side asks of an engine and gets back, in Choir's own types (protocol.py,
sampling.py, outputs.py, parsing.py), the roles engines serve (roles.py), and the one door to the engine
implementation behind it (backend.py → vLLM's adapter, engine/vllm/)."""
