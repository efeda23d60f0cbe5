"""rollout/status.py: which hosts count as "as wanted and serving", and the table."""

from __future__ import annotations

import io

from rich.console import Console

from rollout.status import HostStatus, print_status


def render(rows) -> tuple[int, str]:
    out = io.StringIO()
    code = print_status(rows, Console(file=out, width=200))
    return code, out.getvalue()


def test_all_serving_without_drift_is_exit_0():
    rows = [HostStatus("r1", "router", "active", True, router="2/2 healthy"),
            HostStatus("s1", "server", "active", True, "0123456789ab", router="healthy"),
            HostStatus("s2", "rank 1", "active", True, "0123456789ab")]
    code, text = render(rows)
    assert code == 0
    assert "status: 3/3 host(s) as wanted and serving" in text
    assert "none" in text and "2/2 healthy" in text


def test_each_kind_of_trouble_is_named_and_exit_1():
    rows = [HostStatus("ok", "server", "active", True, "0123456789ab"),
            HostStatus("drifted", "server", "active", True, "0123456789ab", drift=["options file changed"]),
            HostStatus("down", "server", "failed (3 restarts)", False, "0123456789ab"),
            HostStatus("out", "server", "active", True, "0123456789ab", router="not listed"),
            HostStatus("gone", "server", error="cannot connect over ssh")]
    code, text = render(rows)
    assert code == 1
    assert "status: 1/5 host(s) as wanted and serving; not: drifted, down, out, gone" in text
    assert "options file changed" in text and "failed (3 restarts)" in text and "cannot connect over ssh" in text
    assert [row.ok for row in rows] == [True, False, False, False, False]
