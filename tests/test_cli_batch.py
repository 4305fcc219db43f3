"""`choir batch -i IN -o OUT`: a Batch API file run offline through Choir's own endpoints (a fake engine here;
tests/integration/test_cli_batch.py runs the real one): one result per request in the input's order, errors among
them; a bad file refused before anything runs, each bad line named."""

import json

import pytest

from choir.cli.batch import main, run_file
from choir.core.settings import Settings
from tests.fakes import FakeEngine, fake_engine_factory


def line(custom_id, model="fake-model", url="/v1/chat/completions"):
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url,
                       "body": {"model": model, "messages": [{"role": "user", "content": custom_id}]}})


async def test_each_request_answered_in_order_errors_among_them(tmp_path):
    engine = FakeEngine(max_model_len=1024)
    out = tmp_path / "out.jsonl"
    content = "\n".join([line("a"), line("b", model="nope"), line("c")]).encode()
    failed = await run_file(Settings(served_model_name="fake-model"), content, out, 2,
                            engine_factory=fake_engine_factory(engine), progress=False)
    results = [json.loads(text) for text in out.read_text().splitlines()]
    assert failed == 1 and [r["custom_id"] for r in results] == ["a", "b", "c"]
    assert results[0]["response"]["status_code"] == 200 and results[0]["error"] is None
    assert results[0]["response"]["body"]["choices"][0]["message"]["content"] == "Hello world!"
    assert results[1]["response"]["status_code"] == 400 and "nope" in results[1]["response"]["body"]["error"]["message"]
    assert len(engine.calls) == 2


async def test_a_bad_file_is_refused_naming_each_bad_line(tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    content = "\n".join([line("a"), "{oops", line("a")]).encode()
    assert await run_file(Settings(served_model_name="fake-model"), content, out, 2,
                          engine_factory=fake_engine_factory(FakeEngine()), progress=False) is None
    err = capsys.readouterr().err
    assert "line 2: This line is not valid JSON" in err and "line 3:" in err and "custom_id" in err
    assert not out.exists()
    mixed = "\n".join([line("a"), line("b", url="/v1/completions")]).encode()
    assert await run_file(Settings(), mixed, out, 2, progress=False) is None
    assert "one endpoint" in capsys.readouterr().err


def test_the_command_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["-i", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "out.jsonl")])
    assert "cannot be read" in str(exited.value)
    with pytest.raises(SystemExit) as exited:
        main(["-o", "out.jsonl"])
    assert exited.value.code == 2 and "--input-file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["-i", "in", "-o", "out", "--max-concurrency", "0"])
    assert "--max-concurrency" in str(exited.value)
