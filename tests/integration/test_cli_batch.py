"""`choir batch` for real: the bundled model's engine started by the command itself, a file of chat and a line for
a model not served, the results file read back (one line per request, in order)."""

import json
import os
import subprocess
import sys

import pytest

from tests.integration.server import ROOT

pytestmark = pytest.mark.engine


def test_choir_batch_runs_a_file_offline(tmp_path):
    def line(custom_id, model="choir-tiny"):
        return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                           "body": {"model": model, "messages": [{"role": "user", "content": "hi"}],
                                    "max_tokens": 4}})

    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join([line("a"), line("b", model="nope"), line("c")]) + "\n")
    done = subprocess.run([sys.executable, "-m", "choir", "batch", "-i", str(source), "-o", str(out)], cwd=ROOT,
                          env={**os.environ, "VLLM_HOST_IP": "127.0.0.1", "CHOIR_LOG_LEVEL": "warning"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(text) for text in out.read_text().splitlines()]
    assert [r["custom_id"] for r in results] == ["a", "b", "c"]
    assert [r["response"]["status_code"] for r in results] == [200, 400, 200]
    assert results[0]["response"]["body"]["usage"]["completion_tokens"] >= 1
    assert "choir batch" in done.stderr  # the progress bar
