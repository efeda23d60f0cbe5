"""Shared helpers of the steps: paths, rendering, restart stamps, disk and preflight checks, run state."""
