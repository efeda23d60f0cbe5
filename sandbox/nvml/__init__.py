"""NVML stand-in for sandbox hosts: libnvidia-ml.so.1 over the simulated GPUs (see build.py)."""
