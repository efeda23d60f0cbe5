"""Every command the README shows in a code block is run by some test. This docstring is the list the
test holds the README to: one line per command, as the README writes it (up to its comment), then `->`
and the tests that run it through the same entry point (the sandbox's inventory standing in for ct200's;
the README's placeholders, e.g. INVENTORY, NAME, filled in). A README command missing here, a line here
the README no longer shows, or a test named here that does not exist fails it.

make demo -> tests/integration/test_demo.py::test_make_demo_exits_0_and_says_every_milestone_in_order
make test -> .ci/run (CI runs it whole); tests/unit/test_make_test.py::test_make_test_with_a_part_runs_its_phases_and_leaves_their_reports
export SGLANG_API_KEY=... -> tests/integration/test_key_secrecy.py::test_converged_with_the_key
export HF_TOKEN=... -> tests/integration/test_faults_hub.py::test_a_wrong_token_fails_clearly_and_is_never_written_down
pyinfra inventory/ct200.py deploy.py --dry --diff -> tests/integration/test_incident.py::test_dry_run_plans_the_whole_fix_and_changes_nothing
pyinfra inventory/ct200.py deploy.py -> tests/integration/test_incident.py::test_run2_converges_the_incident_host
pyinfra INVENTORY stage.py [--dry] -> tests/integration/test_stage_faults.py::test_the_next_stage_finishes_without_a_restart_and_the_deploy_only_switches
pyinfra INVENTORY verify.py -> tests/integration/test_start_gates.py::test_verify_runs_every_gate_on_the_server_as_it_serves_and_a_stopped_one_fails_untouched
pyinfra INVENTORY rollback.py [--dry] -> tests/integration/test_stage_faults.py::test_the_next_stage_finishes_without_a_restart_and_the_deploy_only_switches; tests/integration/test_server_envs.py::test_a_package_change_is_built_beside_the_serving_venv_switched_at_the_restart_and_rolled_back_exactly
python -m rollout INVENTORY --batch-size 2 --canary 1 [--max-failed 0] [--dry [--diff]] \\ -> tests/integration/test_rollout.py::test_rolling_rollout_canary_then_batches_of_two; tests/integration/test_rollout.py::test_dry_rollout_plans_every_batch_and_changes_nothing
python -m rollout INVENTORY --stage-only [--stage-parallel N] -> tests/integration/test_rollout.py::test_the_readmes_stage_only_and_make_rollout_on_the_serving_fleet
python -m rollout INVENTORY --status [--limit PATTERN] -> tests/integration/test_rollout.py::test_status_shows_the_fleet_and_drift_and_changes_nothing
python -m rollout INVENTORY --verify [--limit PATTERN] -> tests/integration/test_rollout.py::test_verify_runs_every_gate_on_every_server_and_changes_nothing
python -m rollout INVENTORY --rollback [--batch-size N] [--limit PATTERN] -> tests/integration/test_rollout.py::test_rollback_on_demand_puts_the_previous_good_configuration_back_behind_the_router
make rollout INVENTORY=inventory/sandbox_fleet.py BATCH=2 CANARY=1 -> tests/integration/test_rollout.py::test_the_readmes_stage_only_and_make_rollout_on_the_serving_fleet
make demo KEEP=1 -> tests/integration/test_real_server.py::test_make_demo_real_keep_answers_a_chat_request_and_keeps_the_host
make demo REAL=1 -> tests/integration/test_real_server.py::test_make_demo_real_keep_answers_a_chat_request_and_keeps_the_host
make test INTEGRATION=tests/integration/test_rollout.py -> tests/unit/test_make_test.py::test_make_test_with_a_part_runs_its_phases_and_leaves_their_reports
make lint -> tests/unit/test_make_test.py::test_make_test_with_a_part_runs_its_phases_and_leaves_their_reports
make unit -> tests/unit/test_make_test.py::test_make_test_with_a_part_runs_its_phases_and_leaves_their_reports
make up HOSTS=3 | make status | make down -> tests/integration/test_sandbox_cli.py::test_build_up_status_ssh_kill_hub_stats_and_down
make clean -> not run: it removes the .venv the tests run from (it is `make down`, tested above, then rm -rf .venv)
python -m sandbox up --hosts 3 -> tests/integration/test_sandbox_cli.py::test_build_up_status_ssh_kill_hub_stats_and_down
python -m sandbox up --scenario ct200-incident -> tests/integration/test_sandbox_cli.py::test_the_incident_scenario_and_its_disk_fix
python -m sandbox up --gpus 8 --gpu-mib MIB --compute-cap 12.0 --p2p OK --gpu-name NAME -> tests/integration/test_sandbox_cli.py::test_another_gpu_layout
python -m sandbox grow-disk sgc1 /srv/models 256 -> tests/integration/test_sandbox_cli.py::test_the_incident_scenario_and_its_disk_fix
python -m sandbox status | down | ssh NAME -- CMD -> tests/integration/test_sandbox_cli.py::test_build_up_status_ssh_kill_hub_stats_and_down
python -m sandbox reboot sgc1 -> tests/integration/test_reboot.py::test_reboot_frees_simulated_gpu_memory
python -m sandbox kill sgc1 -> tests/integration/test_sandbox_cli.py::test_build_up_status_ssh_kill_hub_stats_and_down
python -m sandbox hub-stats [--reset] -> tests/integration/test_sandbox_cli.py::test_build_up_status_ssh_kill_hub_stats_and_down; tests/unit/test_hub_faults.py::test_serve_follows_the_faults_file_and_hub_stats_reads_the_counts
python -m sandbox build [--rebuild] -> tests/integration/test_sandbox_cli.py::test_build_up_status_ssh_kill_hub_stats_and_down
pyinfra inventory/sandbox_real.py deploy.py -> tests/integration/test_real_server.py::test_the_real_server_is_what_serves_and_it_answers_a_chat_request
make bench -> tests/integration/test_bench.py::test_make_bench_quick_runs_each_part_to_its_figures (QUICK=1: noop, report, gates, transfer; the fleet parts by hand)
make bench PART=noop -> tests/integration/test_bench.py::test_make_bench_quick_runs_each_part_to_its_figures
make bench QUICK=1 -> tests/integration/test_bench.py::test_make_bench_quick_runs_each_part_to_its_figures
python -m bench.table -> tests/unit/test_readme_commands.py::test_the_small_commands_run
python -m bench.transfer --size-mb 4000 -> tests/integration/test_bench.py::test_make_bench_quick_runs_each_part_to_its_figures (PART=transfer: its main, --size-mb 40)
python -m bench.seeding [--rate-mbps 16] -> not run: it converges a fleet of its own, past the CI budget; `make bench QUICK=1 PART=seeding` runs it by hand (tests/integration/test_bench.py: FLEET_PARTS)
python -m bench.staged -> not run: it converges a fleet of its own, past the CI budget; `make bench QUICK=1 PART=staged` runs it by hand (tests/integration/test_bench.py: FLEET_PARTS)
python -m bench.scale --hosts 1,10,20,50 -> not run: it converges a fleet of its own, past the CI budget; `make bench QUICK=1 PART=scale` runs it by hand (tests/integration/test_bench.py: FLEET_PARTS)
python -m bench.rollout [--before REF] -> not run: it converges a fleet of its own, past the CI budget; `make bench QUICK=1 PART=rollout` runs it by hand (tests/integration/test_bench.py: FLEET_PARTS)
python plan.py kimi-k2.6 --gpus 8 --gpu-mib 97887 -> tests/unit/test_plan_cli.py::test_offline_it_estimates_and_says_so
python plan.py kimi-k2.6 --gpus 8 --gpu-mib 97887 --config-dir tests/fixtures/kimi-k2.5 --json -> tests/unit/test_plan_cli.py::test_json_has_the_plans_terms_and_kimi_k25_at_094_against_the_published_range
python -m core.settings_table [--readme] -> tests/unit/test_readme_commands.py::test_the_small_commands_run
python -c "from tasks.spec import load_profile; print(load_profile('NAME'))" -> tests/unit/test_readme_commands.py::test_the_small_commands_run
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMAND = re.compile(r"(make|pyinfra|python|export)\b")
TEST_REF = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def readme_commands() -> list[str]:
    """The commands of the README's code blocks (4-space indented lines), each up to its `#` comment."""
    found = []
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("    ") and not line.startswith("     ") and COMMAND.match(line.strip()):
            command = re.split(r"\s+#", line.strip())[0].strip()
            if command not in found:
                found.append(command)
    return found


def registry() -> dict[str, str]:
    lines = [line for line in (__doc__ or "").splitlines() if " -> " in line]
    return dict(line.split(" -> ", 1) for line in lines)


def test_every_readme_command_is_listed_and_every_listed_one_is_in_the_readme():
    commands, listed = readme_commands(), registry()
    assert len(commands) > 30 and "make demo" in commands  # positive control: the README's blocks are read
    assert [c for c in commands if c not in listed] == [], "README commands no test runs (list them here)"
    assert [c for c in listed if c not in commands] == [], "listed here, no longer in the README"


def test_every_listed_test_exists():
    missing = []
    for command, runs in registry().items():
        refs = TEST_REF.findall(runs)
        if not refs:
            assert runs.startswith("not run: "), (command, runs)  # the one kind of exception: said why
            continue
        for path, name in refs:
            source = ROOT / path
            if not source.exists() or not re.search(rf"^def {name}\(", source.read_text(), re.M):
                missing.append(f"{command}: {path}::{name}")
    assert missing == []


def test_the_small_commands_run(tmp_path):
    """The README's commands that need no host, run as written."""
    from core.settings_table import settings_table

    def run(*argv: str) -> str:
        proc = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    assert run("-m", "core.settings_table").strip() == settings_table().strip()
    profile = run("-c", "from tasks.spec import load_profile; print(load_profile('kimi-k2.6'))")
    assert "moonshotai/Kimi-K2" in profile, profile
    table = run("-m", "bench.table")
    assert table.startswith("bench: every figure in latest.json") and "figure  value  goal  met" in table, table
