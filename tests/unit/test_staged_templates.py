"""The integration tests' staged template (tests/integration/templates.py): one layer per test run, reused
by every worker of that run, never removed by another session (the unit tests run beside the integration
tests as root, and their session ends first)."""

from __future__ import annotations

import pytest

from sandbox import clones
from sandbox import hosts as sandbox_api
from tests.integration import templates


@pytest.fixture
def snapshots(tmp_path, monkeypatch):
    monkeypatch.setattr(clones, "SNAPSHOT_DIR", tmp_path / "snapshots")
    layer = clones.snapshot_path(templates.LABEL)
    (layer / "opt").mkdir(parents=True)
    return layer


def mark(run: str) -> None:
    templates._side_file("run").write_text(run)


def test_another_runs_layer_is_left_and_this_runs_is_removed(snapshots, monkeypatch):
    monkeypatch.setenv(templates.RUN_ID_ENV, "this-run")
    mark("the-integration-run")
    templates.remove_layer()
    assert snapshots.is_dir()  # not this session's: left for it
    mark("this-run")
    templates.remove_layer()
    assert not snapshots.exists() and not templates._side_file("run").exists()


def test_a_worker_of_the_same_run_reuses_the_layer_without_booting(snapshots, monkeypatch):
    monkeypatch.setenv(templates.RUN_ID_ENV, "this-run")
    mark("this-run")

    def boot(*args, **kwargs):
        raise AssertionError("booted a template although this run's layer is there")

    monkeypatch.setattr(sandbox_api, "up", boot)
    assert templates.staged_layer() == snapshots


def test_an_earlier_runs_layer_is_not_reused(snapshots, monkeypatch):
    monkeypatch.setenv(templates.RUN_ID_ENV, "this-run")
    mark("an-interrupted-run")
    booted = []

    def boot(*args, **kwargs):
        booted.append(kwargs.get("indexes"))
        raise RuntimeError("stop here: the template would boot")

    monkeypatch.setattr(sandbox_api, "remove", lambda name: None)
    monkeypatch.setattr(sandbox_api, "up", boot)
    with pytest.raises(RuntimeError, match="the template would boot"):
        templates.staged_layer()
    assert booted == [[templates.TEMPLATE_INDEX]]
    assert not snapshots.exists()  # the stale layer went first
