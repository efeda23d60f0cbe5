"""What the deploy reads from a host: pyinfra facts, one module per concern.

A leaf package, like ``pyinfra.facts``: each fact is a typed ``FactBase[T]``
with ``command()`` (what runs on the host) and ``process()`` (its output to a
value), next to the dataclasses it returns and their parse helpers. It imports
only the standard library, pyinfra, packaging and ``core.paths``; the steps
(``tasks/``) and the rollout driver import it, never the other way round.

- ``facts.gpu``: the GPUs (nvidia-smi), their P2P matrix, compute processes, the sandbox stand-in
- ``facts.nvml``: GPU memory and compute processes through NVML (the venv's pynvml; nvidia-smi fallback)
- ``facts.interpreter``: a python's version and ensurepip (the interpreter that makes the venv)
- ``facts.systemd``: one unit's state; the unit of a process from its cgroup
- ``facts.files``: a file's digest and text, free bytes where a path is
- ``facts.http``: the HTTP status of a GET on the host
- ``facts.ports``: who listens on a TCP port
- ``facts.venv``: a venv's state, installed distributions, exact pins
- ``facts.compressed_tensors``: compressed-tensors' formats and who pins it
- ``facts.model_dir``: a model dir (files, marker, partial downloads) and its config.json
- ``facts.router``: the workers a router lists

From the command line: ``pyinfra INVENTORY fact facts.gpu.NvidiaGpus``.
"""
