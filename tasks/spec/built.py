"""The built specs: a server's ``Spec`` and a router's ``RouterSpec``,
validated settings plus every value derived from them (paths, the command
line, the environment, the host-dependent attention backend)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from packaging.version import Version
from pydantic import SecretStr, StrictBool, StrictStr, model_validator

from core.paths import CONFIG_DIR, GB, MODELS_ROOT, REMOTE_DIR, SYSTEMD_DIR, revisions_root
from tasks.spec.errors import SpecError, spec_lines
from tasks.spec.fields import PositiveInt, abs_path
from tasks.spec.profile import DraftModel, ModelProfile
from tasks.spec.router_settings import RouterSettings
from tasks.spec.server_settings import HostSettings
from tasks.spec.tables import (
    AUTO_BACKEND,
    AUTO_BACKEND_FALLBACK,
    BACKEND_SUPPORT,
    COMPRESSED_TENSORS_FORMATS,
    MHA_ONLY_BACKENDS,
    MLA_ONLY_BACKENDS,
    NVIDIA_BACKENDS,
    ROUTER_LAUNCHER,
    ComputeCap,
)

_COMPUTE_CAP = re.compile(r"^(\d+)\.(\d+)$")
# Runs the server module in-process with the API key redacted from its logs (remote/server_launch.py).
SERVER_LAUNCHER = f"{REMOTE_DIR}/server_launch.py"


def local_http_url(listen_host: str, port: int) -> str:
    """The URL of a server listening on listen_host:port, as its own host reaches it."""
    address = "127.0.0.1" if listen_host in ("0.0.0.0", "::", "") else listen_host
    if ":" in address:
        address = f"[{address}]"
    return f"http://{address}:{port}"


def parse_cc(compute_cap: str, host_name: str | None = None) -> ComputeCap:
    """'12.0' -> (12, 0), or SpecError."""
    m = _COMPUTE_CAP.match(compute_cap) if isinstance(compute_cap, str) else None
    if not m:
        prefix = f"{host_name}: " if host_name else ""
        raise SpecError(
            [f"{prefix}compute_cap = {compute_cap!r}: expected 'MAJOR.MINOR' as nvidia-smi prints it, e.g. '12.0'"]
        )
    return int(m.group(1)), int(m.group(2))


def auto_backend(cc: ComputeCap, attention: str) -> str:
    """What 'auto' means on this compute capability for this attention type."""
    return AUTO_BACKEND.get((cc[0], attention), AUTO_BACKEND_FALLBACK[attention])


def backend_choices(compute_cap: str, attention: str) -> list[str]:
    """'auto' plus the backends not known to fail for this compute
    capability and attention type (NVIDIA ones; the rest are not ruled out)."""
    cc = parse_cc(compute_cap)
    out = ["auto"]
    for b in NVIDIA_BACKENDS:
        if attention == "mha" and b in MLA_ONLY_BACKENDS or attention == "mla" and b in MHA_ONLY_BACKENDS:
            continue
        support = BACKEND_SUPPORT.get(b)
        if support is not None and not support[0](cc):
            continue
        out.append(b)
    return out


class _UnitFiles:
    """Paths derived from a spec's ``unit_name`` (servers and routers alike), and
    its API key as the header line of the root-only auth file."""

    if TYPE_CHECKING:  # provided by the spec classes (a field or a property)

        @property
        def unit_name(self) -> str: ...

        @property
        def api_key(self) -> SecretStr | None: ...

    @property
    def unit_stem(self) -> str:
        return self.unit_name[: -len(".service")]

    @property
    def unit_path(self) -> str:
        return f"{SYSTEMD_DIR}/{self.unit_name}"

    @property
    def auth_path(self) -> str:
        """Root-only (0600) file with the API key as an HTTP header line, read by
        curl -H @FILE, remote/router_client.py and (routers) remote/router_launch.py."""
        return f"{CONFIG_DIR}/{self.unit_stem}.auth"

    @property
    def auth_file(self) -> str | None:
        """auth_path when there is a key, else None."""
        return self.auth_path if self.api_key is not None else None

    def auth_header(self) -> str:
        """The API key as an HTTP header line ('' without a key)."""
        return "" if self.api_key is None else f"Authorization: Bearer {self.api_key.get_secret_value()}\n"


class RouterSpec(_UnitFiles, RouterSettings):
    """One router host's settings, validated, with the derived values.

    .. code:: python

        spec = build_spec("sgc10", {"role": "router", "router_url": "http://10.77.10.2:30000"})
        spec.router_argv  # [venv python, -m, sglang_router.launch_router, --host, ...]
    """

    host_name: StrictStr
    api_key: SecretStr | None = None

    # a router host is never part of a multi-node TP group
    is_multinode: ClassVar[bool] = False
    group_key: ClassVar[None] = None
    group_label: ClassVar[None] = None

    @property
    def python_bin(self) -> str:
        return f"{self.router_venv_path}/bin/python"

    @property
    def unit_name(self) -> str:
        return self.router_unit_name

    @property
    def local_url(self) -> str:
        """The router as seen from its own host."""
        return local_http_url(self.router_listen_host, self.router_listen_port)

    @property
    def router_argv(self) -> list[str]:
        """The router's command line (workers are added at run time through POST /workers).
        With an API key: our launcher, which reads the key from the root-only
        key file and hands it to the router's Python API, never to argv."""
        start = [self.python_bin, "-m", self.router_module]
        if self.api_key is not None:
            start = [self.python_bin, ROUTER_LAUNCHER, "--auth-file", self.auth_path, "--"]
        return [
            *start,
            "--host", self.router_listen_host,
            "--port", str(self.router_listen_port),
            "--policy", self.router_policy,
            "--prometheus-host", self.router_prometheus_host,
            "--prometheus-port", str(self.router_prometheus_port),
            *self.router_extra_args,
        ]  # fmt: skip


class Spec(_UnitFiles, HostSettings):
    """One server host's settings, validated, with every derived value.

    Derived (properties): python_bin, unit_stem, options_path, env_path,
    unit_path, served_model_name, model_bytes, margin_bytes, draft,
    speculative_argv, is_multinode, server_argv, server_options (rendered by
    core/render.py), unit_env, resolved.
    """

    host_name: StrictStr
    role: Literal["server"] = "server"  # a router host builds a RouterSpec
    profile: ModelProfile
    model_dir: Annotated[StrictStr, abs_path(f"or None for {MODELS_ROOT}/<served_model_name>")]  # derived when unset
    tp_size: PositiveInt  # derived when unset
    api_key: SecretStr | None = None
    hf_token: SecretStr | None = None
    # Set by resolve(): the facts the host-dependent values came from.
    compute_cap: StrictStr | None = None
    p2p_ok: StrictBool | None = None
    p2p_level: StrictStr | None = None  # NCCL_P2P_LEVEL the GPU topology asks for (core/host_fitness.py)
    attention_backend_requested: StrictStr | None = None

    @model_validator(mode="before")
    @classmethod
    def _derive(cls, data: Any) -> Any:
        """model_dir and tp_size when unset."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        profile = data.get("profile")
        if data.get("model_dir") is None:
            served = getattr(profile, "served_model_name", None)
            if served is None and isinstance(profile, Mapping):
                served = profile.get("served_model_name")
            data["model_dir"] = f"{MODELS_ROOT}/{served or data.get('model', 'model')}"
        draft = profile.get("draft") if isinstance(profile, Mapping) else getattr(profile, "draft", None)
        if draft is None:
            data["draft_dir"] = None  # no draft model: nothing to put there
        elif data.get("draft_dir") is None and isinstance(data["model_dir"], str):
            data["draft_dir"] = data["model_dir"].rstrip("/") + "-draft"
        if data.get("tp_size") is None:
            gpus, nnodes = data.get("gpu_ids"), data.get("nnodes", 1)
            per_node = len(gpus) if isinstance(gpus, list) and gpus else 1
            data["tp_size"] = per_node * (nnodes if isinstance(nnodes, int) and nnodes >= 1 else 1)
        return data

    @model_validator(mode="after")
    def _with_profile(self) -> Spec:
        lines = []
        if self.attention_backend in MLA_ONLY_BACKENDS and self.profile.attention != "mla":
            lines.append(
                f"attention_backend = {self.attention_backend!r} implements only MLA attention but model "
                f"{self.model!r} uses {self.profile.attention}: allowed: 'auto' or a non-MLA-only backend"
            )
        if self.attention_backend in MHA_ONLY_BACKENDS and self.profile.attention != "mha":
            lines.append(
                f"attention_backend = {self.attention_backend!r} implements only MHA attention but model "
                f"{self.model!r} uses {self.profile.attention}: allowed: 'auto' or an MLA-capable backend"
            )
        lines += self._draft_dir_problems()
        if lines:
            raise spec_lines(*lines)
        return self

    def _draft_dir_problems(self) -> list[str]:
        """The draft needs a directory of its own: its marker and its files beside the model's would mix."""
        if self.draft_dir is None:
            return []
        draft, model = self.draft_dir.rstrip("/") + "/", self.model_dir.rstrip("/") + "/"
        if draft.startswith(model) or model.startswith(draft):
            return [f"draft_dir = {self.draft_dir!r}: is, holds or lies in model_dir {self.model_dir!r}: the draft "
                    f"model needs a directory of its own (its own marker): allowed: e.g. "
                    f"{self.model_dir.rstrip('/') + '-draft'!r} (the default)"]
        return []

    # -- paths

    @property
    def python_bin(self) -> str:
        """The server's venv's interpreter, which runs the server."""
        return f"{self.server_venv}/bin/python"

    # -- the server's environment: one venv per package set, named by its digest

    @property
    def env_inputs(self) -> dict[str, Any]:
        """What the server's venv is built from; the same inputs build the same venv. The
        compressed-tensors decision (tasks/quant_deps.py) follows from the packages, the
        hold/conflict settings and the first release the model's declared format needs, so
        those are inputs too (models whose formats need no newer release share a venv)."""
        quant = self.profile.quantization
        first = min(COMPRESSED_TENSORS_FORMATS.values(), key=Version)  # every release has its members
        floor = COMPRESSED_TENSORS_FORMATS.get(quant.format or "", first) if quant is not None and \
            quant.quant_method == "compressed-tensors" else first
        return {
            "python": self.venv_python,
            "packages": sorted(self.packages),
            "packages_no_deps": sorted(self.packages_no_deps),
            "compressed_tensors_hold": sorted(self.compressed_tensors_hold),
            "compressed_tensors_allow_conflicts": sorted(self.compressed_tensors_allow_conflicts),
            "compressed_tensors_floor": floor,
        }

    @property
    def env_digest(self) -> str:
        """12 hex digits of sha256 over ``env_inputs`` (canonical JSON)."""
        text = json.dumps(self.env_inputs, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def envs_dir(self) -> str:
        """Where the server's venvs live, one per package set: VENV_PATH-envs/<digest>."""
        return f"{self.venv_path.rstrip('/')}-envs"

    @property
    def server_venv(self) -> str:
        """The venv this configuration's server runs from (built and checked before the
        restart switches the unit to it; the serving one is never changed)."""
        return f"{self.envs_dir}/{self.env_digest}"

    # -- model revisions side by side: one dir per revision, files shared between them hard-linked

    @property
    def revisions_dir(self) -> str:
        """Where the model's revisions live, one dir each: MODEL_DIR-revisions/<revision[:12]>."""
        return revisions_root(self.model_dir)

    @property
    def model_path(self) -> str:
        """The dir the server reads the pinned revision from (downloaded and verified beside the
        serving revision; the restart switches the unit to it)."""
        return f"{self.revisions_dir}/{self.profile.revision[:12]}"

    @property
    def draft_revisions_dir(self) -> str | None:
        return revisions_root(self.draft_dir) if self.draft_dir is not None else None

    @property
    def draft_path(self) -> str | None:
        """The dir the server reads the draft model's pinned revision from (None: no draft)."""
        draft = self.draft
        if draft is None or self.draft_dir is None:
            return None
        return f"{revisions_root(self.draft_dir)}/{draft.revision[:12]}"

    @property
    def options_path(self) -> str:
        """SGLang --config YAML (0600, holds the API key)."""
        return f"{CONFIG_DIR}/{self.unit_stem}.yaml"

    @property
    def env_path(self) -> str:
        """The unit's EnvironmentFile (0600)."""
        return f"{CONFIG_DIR}/{self.unit_stem}.env"

    # -- model

    @property
    def served_model_name(self) -> str:
        return self.profile.served_model_name

    @property
    def model_bytes(self) -> int:
        """The profile's approximate size; the model step asks the Hub for exact sizes."""
        return self.profile.size_bytes

    @property
    def margin_bytes(self) -> int:
        return int(self.size_margin_gb * GB)

    @property
    def draft(self) -> DraftModel | None:
        """The profile's draft model (speculative decoding), downloaded into draft_dir; None: no draft."""
        return self.profile.draft

    @property
    def speculative_argv(self) -> list[str]:
        """SGLang 0.5.23's flags for the profile's draft ([] without one): the draft is read from draft_dir."""
        draft, draft_path = self.profile.draft, self.draft_path
        if draft is None or draft_path is None:
            return []
        return [
            "--speculative-algorithm", draft.algorithm,
            "--speculative-draft-model-path", draft_path,
            "--speculative-num-steps", str(draft.num_steps),
            "--speculative-eagle-topk", str(draft.eagle_topk),
            "--speculative-num-draft-tokens", str(draft.num_draft_tokens),
        ]  # fmt: skip

    # -- multi-node

    @property
    def is_multinode(self) -> bool:
        return self.nnodes > 1

    @property
    def group_key(self) -> str | None:
        """What identifies this host's TP group (None: single node): the
        node_group's label, or dist_init_addr for the per-host fields."""
        if not self.is_multinode:
            return None
        return self.node_group.label if self.node_group is not None else str(self.dist_init_addr)

    @property
    def group_label(self) -> str | None:
        """The TP group in messages."""
        if not self.is_multinode:
            return None
        return self.node_group.label if self.node_group is not None else f"at {self.dist_init_addr}"

    @property
    def resolved(self) -> bool:
        """True once resolve() filled in the host-dependent values."""
        return self.compute_cap is not None

    # -- the server

    @property
    def server_argv(self) -> list[str]:
        """The server's command line. No secret: the API key is in the
        options file (--config), which SGLang merges in-process. The venv's
        python runs SERVER_LAUNCHER with the server module as its first
        argument (the server's own arguments follow, from argv[3] on)."""
        argv = [
            self.python_bin,
            SERVER_LAUNCHER, self.server_module,
            "--model-path", self.model_path,
            "--served-model-name", self.served_model_name,
            "--tp-size", str(self.tp_size),
        ]  # fmt: skip
        if self.attention_backend != "auto":  # unresolved auto: SGLang chooses
            argv += ["--attention-backend", self.attention_backend]
        argv += ["--host", self.listen_host, "--port", str(self.listen_port)]
        if self.profile.trust_remote_code:
            argv.append("--trust-remote-code")
        argv += self.speculative_argv
        if self.is_multinode:
            argv += ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank)]
            argv += ["--dist-init-addr", str(self.dist_init_addr)]
        argv += list(self.profile.extra_server_args) + list(self.extra_server_args)
        if self.server_options:
            argv += ["--config", self.options_path]
        return argv

    @property
    def server_options(self) -> dict[str, str]:
        """The options file's content (dash-spelled keys, as SGLang's --config
        wants them). Holds the secret in plain text: write it 0600 only."""
        options = {}
        if self.api_key is not None:
            options["api-key"] = self.api_key.get_secret_value()
        return options

    @property
    def unit_env(self) -> dict[str, str]:
        """The server's environment (the unit's EnvironmentFile). extra_env wins."""
        env = {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, self.gpu_ids)),
            "HF_HUB_OFFLINE": "1",  # the server reads the downloaded model only
        }
        if not self.is_multinode:
            env["NCCL_IB_DISABLE"] = "1"
        # P2P from the host's P2P fact only: known broken -> off; OK or unknown -> NCCL chooses
        # (NCCL_P2P_LEVEL unset: NCCL picks the level itself; nothing is assumed when unknown)
        explicit_p2p = any(k.startswith("NCCL_P2P_") for k in self.extra_env)
        if self.p2p_ok is False and len(self.gpu_ids) > 1 and not explicit_p2p:
            env["NCCL_P2P_DISABLE"] = "1"
        elif self.p2p_level and len(self.gpu_ids) > 1 and not explicit_p2p:
            env["NCCL_P2P_LEVEL"] = self.p2p_level  # TP GPUs across the CPU interconnect (topology)
        if self.compute_cap is not None and parse_cc(self.compute_cap)[0] == 12:
            env["SGLANG_ENABLE_JIT_DEEPGEMM"] = "0"  # DeepGEMM does not support SM120
        env.update(self.extra_env)
        return env

    # -- host-dependent resolution

    def resolve(self, compute_cap: str, p2p_ok: bool | None, p2p_level: str | None = None) -> Spec:
        """A copy with the host-dependent values filled in from preflight's
        facts: compute_cap as nvidia-smi prints it ('12.0'), p2p_ok whether
        P2P works between the GPUs used (None: unknown), p2p_level the NCCL
        P2P level their topology asks for (None: NCCL picks). Raises SpecError
        for a backend known to fail on this compute capability."""
        cc = parse_cc(compute_cap, self.host_name)
        attention = self.profile.attention
        requested = self.attention_backend_requested or self.attention_backend
        backend = auto_backend(cc, attention) if requested == "auto" else requested
        support = BACKEND_SUPPORT.get(backend)
        if requested != "auto" and support is not None and not support[0](cc):
            ok = [b for b in backend_choices(compute_cap, attention) if b != "auto"]
            raise SpecError(
                [
                    f"{self.host_name}: attention_backend = {backend!r} does not work on compute "
                    f"capability {compute_cap} ({support[1]}): allowed: 'auto' (-> {auto_backend(cc, attention)!r} "
                    "here), " + ", ".join(map(repr, ok))
                ]
            )
        return self.model_copy(
            update={
                "attention_backend": backend,
                "attention_backend_requested": requested,
                "compute_cap": compute_cap,
                "p2p_ok": None if p2p_ok is None else bool(p2p_ok),
                "p2p_level": p2p_level,
            }
        )


# What building a host's data gives: a server's Spec or a router's RouterSpec
# (narrow with isinstance, or with ``spec.role == "router"``).
AnySpec = Spec | RouterSpec
