"""choir/engine/vllm/cpu_amx_fix.py asks for the AMX state where the CPU has it, and only there (the real engine's
evidence: tests/integration/test_data_parallel.py, one OpenMP thread per rank)."""

import torch

from choir.engine.vllm import cpu_amx_fix


def test_amx_is_asked_for_where_the_cpu_has_it(monkeypatch):
    asked: list[bool] = []
    monkeypatch.setattr(torch.cpu, "_init_amx", lambda: asked.append(True) or True)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    cpu_amx_fix.register()
    assert asked == [True]


def test_nothing_is_asked_without_amx(monkeypatch):
    asked: list[bool] = []
    monkeypatch.setattr(torch.cpu, "_init_amx", lambda: asked.append(True) or True)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    cpu_amx_fix.register()
    assert asked == []


def test_the_real_call_is_harmless_here():
    cpu_amx_fix.register()  # idempotent: asking again (or on a CPU without AMX) changes nothing
    cpu_amx_fix.register()
    assert torch.ones(2, dtype=torch.bfloat16).sum().item() == 2
