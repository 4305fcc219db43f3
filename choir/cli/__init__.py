"""The `choir` command (main.py): `choir serve [MODEL] [vllm serve's flags]` read through vLLM's own parser
(flags.py), then Choir in one process, N API processes, or headless engine cores (serve.py, worker.py)."""
