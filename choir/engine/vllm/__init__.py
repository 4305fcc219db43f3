"""vLLM's adapter: the only package that imports vLLM. It turns the seam's types into vLLM's and back
(engine.py, pooling.py, sampling.py, parsers.py, errors.py), starts engines in this process or attaches to
cores a supervisor started (start.py, client.py, cores.py, supervisor.py), builds their flags (args.py), and
registers three vLLM plugins for the CPU build (cpu_*_fix.py). Reached only through choir/engine/backend.py."""
