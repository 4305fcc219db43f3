"""The engine plugin: the engines' AsyncLLM lifecycles (config.py) and wiring (plugin.py), the seam the
HTTP layer talks to (protocol.py), and vLLM behind it: vllm_base.py (what both engines share),
vllm_engine.py (generation, LoRA adapters, start-up), vllm_embedding.py (the pooling engine),
vllm_errors.py (vLLM's refusals at the seam) and cpu_lora_fix.py (a vLLM plugin)."""
