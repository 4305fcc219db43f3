"""The soak benchmark's two-minute version (issue #21, benchmarks/soak.py): the mixed load, clients that leave
mid-request and bad requests, against the session's server."""

import asyncio

import pytest

from benchmarks.soak import failures, print_summary, soak

pytestmark = pytest.mark.engine


def test_two_minutes_of_mixed_load_leave_no_5xx_no_engine_request_and_no_hang(server):
    result = asyncio.run(soak(server.base_url, 120, 24, server.process.pid, sample_seconds=30))
    print_summary(result)  # shown if the test fails
    assert result["server_5xx"] == 0, result["server_statuses"]
    assert result["engine_requests_left"] == 0
    assert result["hangs"] == []
    bad = {kind: stats["outcomes"] for kind, stats in result["by_kind"].items() if kind.startswith("bad: ")}
    assert len(bad) >= 10  # most of the kinds of bad request came up
    assert all(status[0] == "4" and len(status) == 3 for outcomes in bad.values() for status in outcomes), bad  # shaped
    assert result["by_kind"]["leave stream"]["outcomes"].get("left")
    assert failures(result) == []
