"""bench/table.py: every figure of latest.json in one table, with its goal and whether it is met."""

from __future__ import annotations

import json

from bench import table


def test_rows_show_goals_met_or_not_and_figures_without_goals():
    figures = {"started_at": "2026-01-01T00:00:00Z", "noop_s": 2.5, "ansible_over_noop": 7.0,
               "noop_over_floor": 2.4, "crash_report_s": 0.4, "noop_host_commands": 10, "extra_figure": 1.5}
    rows = {name: (value, goal, met) for name, value, goal, met in table.rows(figures)}
    assert rows["ansible_over_noop"] == ("7.000", ">= 6", "yes")
    assert rows["noop_over_floor"] == ("2.400", "<= 2", "NO")
    assert rows["crash_report_s"][2] == "yes"
    assert rows["noop_s"] == ("2.500", "", "") and rows["noop_host_commands"] == ("10", "", "")
    assert "started_at" not in rows and "extra_figure" in rows
    assert [name for name, *_ in table.rows(figures)][:3] == ["noop_s", "ansible_over_noop", "noop_over_floor"]


def test_main_reads_the_results_file_and_copes_without_one(tmp_path, capsys):
    results = tmp_path / "latest.json"
    results.write_text(json.dumps({"download_over_curl": 0.5}))
    text = table.main(results)
    assert "download_over_curl" in text and "NO" in text
    assert "figure" in table.main(tmp_path / "missing.json")
    assert "download_over_curl" in capsys.readouterr().out
