"""bench/noop.py's floor: each thing the deploy looks at, once, in one round trip."""

from __future__ import annotations

from bench.noop import distinct, floor_script


def test_the_floor_runs_a_command_once_and_not_again_when_an_earlier_one_ran_it():
    unit = "sh -c 'systemctl show sglang.service'"
    prefetch = "sh -c 'echo 0; ( cat /srv/x ) </dev/null; echo 1; ( systemctl show sglang.service ) </dev/null'"
    assert distinct([unit, "sh -c 'true'", unit]) == [unit, "sh -c 'true'"]
    assert distinct([prefetch, unit, "sh -c 'curl -s http://h/health'", unit]) == [
        prefetch, "sh -c 'curl -s http://h/health'"]
    assert floor_script([prefetch, unit]) == f"{prefetch} </dev/null\n"
