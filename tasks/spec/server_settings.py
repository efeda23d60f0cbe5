"""A server host's settings (HostSettings, one field per host.data key of
group_data/all.py) and the multi-node TP group they may describe (NodeGroup)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictBool, StrictStr, field_validator, model_validator

from core.paths import MODELS_ROOT
from tasks.spec.base import CommonSettings
from tasks.spec.errors import spec_lines
from tasks.spec.fields import (
    FROZEN,
    AttentionBackend,
    BaseUrl,
    DistInitAddr,
    DriverVersion,
    ExtraEnv,
    GpuIds,
    GroupName,
    HeldPackages,
    HostAddress,
    HttpUrl,
    NonNegativeInt,
    Number,
    OwnDir,
    PackageNames,
    PinnedRequirements,
    Port,
    PositiveInt,
    ProcessNames,
    Rank0Address,
    SecretEnvName,
    ServerArgs,
    UnitNames,
    python_module,
    service_unit,
    url_port,
)


class NodeGroup(BaseModel):
    """A multi-node TP group, described once (group data shared by its hosts).

    Each host's --nnodes, --node-rank and --dist-init-addr are derived from it:
    nnodes = len(hosts), node_rank = this host's position in hosts, and
    dist_init_addr = dist_init_host (default: rank 0's ssh_hostname) : dist_init_port.

    .. code:: python

        kimi_tp16 = (["gpu-a", "gpu-b"], {"node_group": {"hosts": ["gpu-a", "gpu-b"], "dist_init_port": 20000}})
    """

    model_config = FROZEN

    hosts: list[StrictStr] = Field(
        description="the inventory names of the group's hosts in rank order (rank 0 first), at least 2, each once"
    )
    dist_init_port: Port = Field(description="the TCP port rank 0 listens on for the rendezvous, an integer 1..65535")
    dist_init_host: Rank0Address | None = Field(
        None,
        description="rank 0's address as the other ranks reach it, an IP address or hostname; "
        "unset: rank 0's ssh_hostname (or its inventory name)",
    )
    name: GroupName | None = Field(None, description="a label for the group in messages; unset: the hosts joined with '+'")

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        if len(v) < 2:
            raise ValueError(
                f"a node group needs at least 2 hosts (got {len(v)}): allowed: a list of the group's "
                "inventory host names in rank order, e.g. ['gpu-a', 'gpu-b']; a single host needs no node_group"
            )
        problems = []
        for name in dict.fromkeys(v):
            ranks = [i for i, other in enumerate(v) if other == name]
            if len(ranks) > 1:
                problems.append(
                    f"{name!r} is listed {len(ranks)} times (ranks {', '.join(map(str, ranks))}): "
                    f"each rank 0..{len(v) - 1} needs exactly one host and each host has exactly one rank"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return v

    @property
    def label(self) -> str:
        return self.name or "+".join(self.hosts)

    def address(self, addresses: Mapping[str, str] | None = None) -> str:
        """dist_init_addr: rank 0's address (bracketed when IPv6) and the port."""
        host = self.dist_init_host or (addresses or {}).get(self.hosts[0]) or self.hosts[0]
        host = host.strip("[]")
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{self.dist_init_port}"


class HostSettings(CommonSettings):
    """One field per host.data key of ours (defaults match group_data/all.py)."""

    model: StrictStr = Field(description="the name of a profile in models/ (models/<model>.yaml)")
    model_dir: OwnDir | None = Field(
        None,
        description="absolute path on the host of a directory of its own (at least two levels below /, not "
        f"directly under a system directory); unset: {MODELS_ROOT}/<served_model_name>",
    )
    draft_dir: OwnDir | None = Field(
        None,
        description="absolute path on the host of the draft model's own directory (a profile with a draft only; "
        "at least two levels below /, not directly under a system directory); unset: <model_dir>-draft",
    )
    size_margin_gb: Number = Field(50.0, ge=0, description="GB kept free on the model's disk, a number >= 0")
    keep_revisions: int = Field(2, ge=1, le=10, description="model revisions kept in <model_dir>-revisions after "
                                "a good restart (the serving one and the newest others: rollback points), an "
                                "integer 1..10")
    model_update: Literal["side-by-side", "in-place"] = Field(
        "side-by-side", description="a new model revision is downloaded beside the serving one "
        "('side-by-side', the default: a run refuses when the disk cannot hold both) or, with 'in-place', "
        "the server is stopped, the old revision's files not shared with the new one are removed and the new "
        "one is downloaded while the server is down")
    download_attempts: int = Field(5, ge=1, le=50, description="tries per phase of the download before it "
                                   "gives up on a Hub that fails transiently (5xx, 429, stalls), an integer 1..50")
    download_backoff_s: Number = Field(5.0, gt=0, le=600, description="first wait between download attempts, "
                                       "doubling up to 60 s, seconds > 0 and <= 600")
    download_read_timeout_s: int = Field(30, ge=1, le=3600, description="seconds without a byte before a "
                                         "file's transfer counts as stalled, an integer 1..3600")
    venv_path: OwnDir = Field(
        "/opt/sglang/venv",
        description="absolute path on the host naming the server's venvs, a directory of its own (at least two "
        "levels below /, not directly under a system directory): each package set is built into "
        "<venv_path>-envs/<digest>",
    )
    keep_envs: int = Field(2, ge=1, le=20, description="venvs kept in <venv_path>-envs after a good restart "
                           "(the serving one and the newest others: rollback points), an integer 1..20")
    packages: PinnedRequirements = Field(
        default_factory=lambda: ["sglang==0.5.23"],
        description="pinned pip requirements: 'name==version' (or 'name @ URL')",
    )
    packages_no_deps: PinnedRequirements = Field(
        default_factory=list,
        description="pinned pip requirements installed with --no-deps (e.g. sglang beside a CPU-only torch)",
    )
    compressed_tensors_allow_conflicts: PackageNames = Field(
        default_factory=list, description="package names whose pip-check conflict is tolerated"
    )
    compressed_tensors_hold: HeldPackages = Field(
        default_factory=lambda: ["torch", "sglang", "flashinfer-python"],
        description="package names held at their installed versions during the upgrade",
    )
    gpu_ids: GpuIds = Field(description="a non-empty list of distinct GPU indexes >= 0 (nvidia-smi order)")
    tp_size: PositiveInt | None = Field(
        None, description="an integer >= 1 equal to len(gpu_ids) x nnodes; unset: derived"
    )
    attention_backend: AttentionBackend = Field("auto", description="'auto' or one of SGLang's backends")
    listen_host: HostAddress = Field("0.0.0.0", description="an IP address or hostname to listen on")
    listen_port: Port = Field(30000, description="an integer 1..65535")
    hf_token_env: SecretEnvName | None = Field(
        "HF_TOKEN", description="NAME of a controller environment variable holding the HF token, or None"
    )
    hf_endpoint: HttpUrl | None = Field(None, description="http(s) URL of a Hub mirror, or None")
    extra_env: ExtraEnv = Field(default_factory=dict, description="environment of the server: a dict of string -> string")
    extra_server_args: ServerArgs = Field(default_factory=list, description="extra SGLang flags, a list of strings")
    unit_name: Annotated[StrictStr, service_unit("sglang.service")] = Field(
        "sglang.service", description="a systemd unit name ending in .service"
    )
    server_module: Annotated[StrictStr, python_module("sglang.launch_server")] = Field(
        "sglang.launch_server", description="dotted Python module run with 'python -m'"
    )
    readiness_timeout_s: Number = Field(3600.0, gt=0, description="seconds, a number > 0")
    start_stall_s: Number | None = Field(
        900.0, gt=0, description="seconds a start may make no progress, a number > 0, or None (no stall check)"
    )
    kv_plan_tolerance: Number = Field(
        0.5, ge=0, le=1, description="a number 0..1: the KV pool SGLang allocates holds at least this fraction "
        "of the memory fit's tokens (0: not checked)"
    )
    perf_tolerance: Number = Field(
        0.8, ge=0, le=1, description="a number 0..1: decode tok/s after a restart at least this fraction of the "
        "host's last good figure (0: not measured)"
    )
    speed_check_max_s: Number = Field(
        30.0, ge=5, le=600, description="seconds 5..600: the speed gate's bound for each concurrency's requests "
        "(speed_check_tokens each)"
    )
    speed_check_tokens: int = Field(
        128, ge=8, le=4096, description="an integer 8..4096: tokens each of the speed gate's requests decodes "
        "(a change is compared with no earlier figure: the last good one counted other tokens)"
    )
    rollback_on_failure: StrictBool = Field(
        True, description="True or False: put the last good configuration back when a restart fails readiness"
    )
    stale_policy: Literal["stop", "fail", "ignore"] = Field("stop", description="'stop', 'fail' or 'ignore'")
    host_fitness: Literal["fail", "warn", "off"] = Field(
        "fail", description="'fail', 'warn' or 'off': what IOMMU translation or ACS redirect between the TP GPUs does"
    )
    allreduce_check: StrictBool = Field(True, description="True or False: an all-reduce over the TP GPUs before a start")
    allreduce_timeout_s: Number = Field(120.0, gt=0, description="seconds, a number > 0")
    allreduce_min_busbw_gbs: Number | None = Field(None, gt=0, description="GB/s, a number > 0, or None (no floor)")
    stale_grace_s: Number = Field(30.0, ge=0, description="seconds between SIGTERM and SIGKILL, >= 0")
    protect_units: UnitNames = Field(default_factory=list, description="systemd unit names never touched")
    protect_process_names: ProcessNames = Field(default_factory=list, description="process names never touched")
    nnodes: PositiveInt = Field(1, description="an integer >= 1")
    node_rank: NonNegativeInt = Field(0, description="an integer 0..nnodes-1")
    dist_init_addr: DistInitAddr | None = Field(None, description="'host:port' of rank 0, required when nnodes > 1")
    node_group: NodeGroup | None = Field(
        None,
        description="None, or a dict {hosts: [rank 0, rank 1, ...], dist_init_port: PORT, dist_init_host?: ADDR, "
        "name?: LABEL} that derives nnodes, node_rank and dist_init_addr",
    )
    # -- fleets: the role of the host, and the router a server registers with (tasks/router.py)
    role: Literal["server", "router"] = Field(
        "server",
        description="'server' (an SGLang server: the whole pipeline) or 'router' (SGLang's router: "
        "group_data/routers.py)",
    )
    router_url: BaseUrl | None = Field(
        None, description="http(s) URL of the SGLang router this server registers with, or None"
    )
    worker_url: BaseUrl | None = Field(
        None, description="http(s) URL at which the router reaches this server (required with router_url), or None"
    )
    drain_timeout_s: Number = Field(
        600.0, gt=0, description="seconds a server taken out of its router may take to finish its requests, > 0"
    )
    min_driver_version: DriverVersion | None = Field(
        None, description="lowest NVIDIA driver version the fleet preflight accepts, e.g. '570.86', or None"
    )

    @model_validator(mode="after")
    def _fleet(self) -> HostSettings:
        lines = []
        if self.router_url is not None and self.worker_url is None:
            lines.append(
                f"worker_url = None: required when router_url = {self.router_url!r}: the URL at which the "
                f"router reaches this server, e.g. 'http://10.0.0.5:{self.listen_port}'"
            )
        if self.worker_url is not None:
            port = url_port(self.worker_url)
            if port != self.listen_port:
                lines.append(
                    f"worker_url = {self.worker_url!r}: its port {port} is not listen_port {self.listen_port}: "
                    f"allowed: a URL of this server's port, e.g. 'http://HOST:{self.listen_port}'"
                )
        if lines:
            raise spec_lines(*lines)
        return self

    @model_validator(mode="after")
    def _together(self) -> HostSettings:
        """The fields together (no model profile needed)."""
        lines = self._tp_problems()
        if self.nnodes > 1 and self.node_rank > 0 and (self.router_url or self.worker_url):
            # Only rank 0 of a multi-node group serves HTTP; the group is one router worker.
            field = "router_url" if self.router_url else "worker_url"
            lines.append(
                f"{field} = {getattr(self, field)!r}: node_rank {self.node_rank} of a {self.nnodes}-node group "
                "serves no HTTP: allowed: None here; set router_url and worker_url on rank 0 only, which "
                "registers the whole group as one worker"
            )
        if self.nnodes > 1 and self.dist_init_addr is None:
            lines.append(
                f"dist_init_addr = None: required when nnodes = {self.nnodes}: "
                "'host:port' of rank 0, e.g. '10.0.0.1:20000'"
            )
        if self.unit_name in self.protect_units:
            lines.append(
                f"protect_units = {self.protect_units!r}: contains our own unit_name {self.unit_name!r}: "
                "a protected unit is never touched, so the deploy could not manage it"
            )
        if lines:
            raise spec_lines(*lines)
        return self

    def _tp_problems(self) -> list[str]:
        """tp_size against the GPUs and nodes, node_rank against nnodes."""
        lines = []
        n = len(self.gpu_ids)
        if self.tp_size is not None:
            if self.nnodes == 1 and self.tp_size != n:
                lines.append(
                    f"tp_size = {self.tp_size} does not match gpu_ids {self.gpu_ids} ({n} GPUs): "
                    "tp_size must equal the number of GPUs"
                )
            elif self.nnodes > 1 and self.tp_size != n * self.nnodes:
                lines.append(
                    f"tp_size = {self.tp_size} does not match gpu_ids {self.gpu_ids} ({n} GPUs) x "
                    f"nnodes {self.nnodes}: tp_size must equal GPUs per node x nnodes = {n * self.nnodes}"
                )
        if self.node_rank >= self.nnodes:
            lines.append(
                f"node_rank = {self.node_rank} is out of range for nnodes = {self.nnodes}: "
                f"allowed: 0..{self.nnodes - 1}"
            )
        return lines


# Our host.data keys, all documented in group_data/all.py.
DATA_KEYS: frozenset[str] = frozenset(HostSettings.model_fields)
