"""Rolling rollouts of deploy.py over a fleet: batches, canary, readiness-gated.

    python -m rollout inventory/sandbox_fleet.py --batch-size 2 --canary 1

See rollout/driver.py (the pyinfra API driver) and rollout/record.py (the
small step deploy.py runs after readiness to record the time to ready).
"""
