"""Stage then switch (rollout/staging.py): the driver's order of stage and batch runs, with run_batch
faked (no host) - the canary first in one run, the later servers staged in runs of --stage-parallel
before any later batch, a failed stage counted and its batch run without it, --stage-only."""

from __future__ import annotations

from types import SimpleNamespace

from rollout import staging
from rollout.driver import Driver, HostResult, RolloutReport, plan_batches
from rollout.summary import print_summary

SERVERS = ["sgc11", "sgc12", "sgc13", "sgc14", "sgc15"]


def fleet(fail_stage: set[str] = frozenset(), max_failed: int = 0, stage: bool = True, stage_only: bool = False,
          parallel: int = 2, groups: dict[str, str] | None = None):
    """A driver over a router and five servers (canary 1, batches of 2) whose run_batch records each run
    as (deploy file, hosts) and fails the stage of ``fail_stage``: (report, runs, echoed lines)."""
    lines: list[str] = []
    runs: list[tuple[str, list[str]]] = []
    driver = Driver("inventory/sandbox_fleet.py", batch_size=2, canary=1, max_failed=max_failed,
                    echo=lines.append, stage=stage, stage_parallel=parallel, stage_only=stage_only)
    driver.specs = {name: object() for name in SERVERS}
    driver.groups = dict(groups or {})

    def run_batch(batch, results, offers=None, deploy_file=None):
        runs.append((deploy_file or driver.deploy_file, list(batch.hosts)))
        for name in batch.hosts:
            failed = deploy_file == staging.STAGE_FILE and name in fail_stage
            results[name].result = "failed" if failed else "ok"
            results[name].error = "python_env: pip: ResolutionImpossible" if failed else ""
            results[name].changed = True

    driver.run_batch = run_batch  # type: ignore[method-assign]
    batches = plan_batches(["sgc10"], SERVERS, 2, 1, driver.groups)
    report = RolloutReport({n: HostResult(n, b.label) for b in batches for n in b.hosts}, batches, exit_code=0)
    converged: list[list[str]] = []
    seeding = SimpleNamespace(offers=lambda names: {}, converged=converged.append)
    (staging.only if stage_only else lambda d, r, s: d._run_batches(batches, r, s))(driver, report, seeding)
    return report, runs, lines, converged


def test_the_canary_switches_in_one_run_then_the_others_stage_in_parallel_runs_before_any_batch():
    report, runs, lines, converged = fleet()
    assert runs == [("deploy.py", ["sgc10"]), ("deploy.py", ["sgc11"]),
                    ("stage.py", ["sgc12", "sgc13"]), ("stage.py", ["sgc14", "sgc15"]),
                    ("deploy.py", ["sgc12", "sgc13"]), ("deploy.py", ["sgc14", "sgc15"])]
    assert report.exit_code == 0
    assert [report.results[n].result for n in SERVERS] == ["ok"] * 5
    assert report.results["sgc11"].staged_s is None and report.results["sgc12"].staged_s is not None
    assert ["sgc12", "sgc13"] in converged  # a staged host holds its revision verified: a seed for the next
    assert "rollout: stage 1: sgc12, sgc13 (nothing restarts)" in lines


def test_without_staging_every_batch_is_one_run():
    """Positive control (--no-stage, and a custom deploy file): no stage run at all."""
    _, runs, _, _ = fleet(stage=False)
    assert [deploy for deploy, _ in runs] == ["deploy.py"] * 4


def test_a_failed_stage_within_max_failed_skips_that_host_in_its_batch_and_the_rollout_goes_on():
    report, runs, lines, _ = fleet({"sgc13"}, max_failed=1)
    assert ("deploy.py", ["sgc12"]) in runs and not any("sgc13" in hosts for d, hosts in runs if d == "deploy.py")
    result = report.results["sgc13"]
    assert (result.result, result.error, result.restarted) == ("failed", "stage: python_env: pip: "
                                                               "ResolutionImpossible", False)
    assert report.exit_code == 1  # tolerated, failed all the same
    assert any("1 host(s) failed, within --max-failed 1" in line for line in lines)


def test_a_failed_stage_past_max_failed_stops_before_any_later_batch_restarts():
    report, runs, lines, _ = fleet({"sgc14"}, max_failed=0)
    assert [d for d, _ in runs] == ["deploy.py", "deploy.py", "stage.py", "stage.py"]  # no batch after the stage
    assert (report.exit_code, report.stopped_after) == (1, "stage")
    assert [report.results[n].result for n in ("sgc12", "sgc13", "sgc15")] == ["staged"] * 3
    assert "no batch after it restarted anything" in lines[-1]
    console = SimpleNamespace(print=lambda *a, **k: None)
    print_summary(report, console)  # the summary renders a stopped stage


def test_a_failed_rank_keeps_its_whole_group_out_of_its_batch():
    groups = {"sgc12": "tp16", "sgc13": "tp16"}
    report, runs, _, _ = fleet({"sgc13"}, max_failed=5, groups=groups)
    assert ("stage.py", ["sgc12", "sgc13", "sgc14"]) in runs  # the group counts as one of --stage-parallel 2
    assert not any("sgc12" in hosts for d, hosts in runs if d == "deploy.py")
    assert report.results["sgc12"].result == "staged" and report.results["sgc13"].result == "failed"


def test_stage_only_stages_every_server_and_restarts_nothing():
    report, runs, _, _ = fleet(stage_only=True, parallel=3)
    assert runs == [("stage.py", ["sgc11", "sgc12", "sgc13"]), ("stage.py", ["sgc14", "sgc15"])]
    assert [report.results[n].result for n in SERVERS] == ["staged"] * 5
    assert report.results["sgc10"].result == "not run" and report.exit_code == 0
    failed, _, _, _ = fleet({"sgc15"}, stage_only=True, parallel=3)
    assert failed.exit_code == 1 and failed.results["sgc15"].error.startswith("stage: ")


def test_stage_chunks_keep_a_group_together():
    chunks = staging.stage_chunks(["a", "b", "c", "d"], 1, {"b": "g", "c": "g"})
    assert [(c.label, c.hosts) for c in chunks] == [("stage 1", ["a"]), ("stage 2", ["b", "c"]), ("stage 3", ["d"])]
