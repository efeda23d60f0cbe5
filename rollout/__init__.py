"""Rolling rollouts of deploy.py over a fleet: batches, canary, readiness-gated.

    python -m rollout inventory/sandbox_fleet.py --batch-size 2 --canary 1

See rollout/driver.py (the pyinfra API driver; it reads each host's result,
failure reason and time to ready from the run state, core/runstate.py) and
rollout/status.py (`--status`).
"""
