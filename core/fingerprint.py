"""The launch fingerprint: what SGLang chose when it started (its /server_info, read on the host
once it serves), held against what the deploy planned. A server that serves but chose something
else (a KV pool far smaller than the memory fit, another attention backend, no speculative
decoding, a shorter context) fails readiness like a crash, with both values; a profile's
``expect: {on_mismatch: warn}`` makes its own expectations warnings instead.

    plan = launch_plan(spec, fit)               # while preparing: from the spec and the memory fit
    problems, warnings = compare(plan, fingerprint_of(server_info))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyinfra import logger

from core.memory_fit import memory_fit, server_arg
from core.ops import gate_failed, read_host_json, record_failure
from core.paths import STATE_DIR

if TYPE_CHECKING:
    from core.memory_fit import MemoryFit
    from tasks.spec import Spec

# /server_info keys kept (sglang 0.5.23 entrypoints/http_server.py server_info: the resolved server
# args plus the scheduler's handshake, managers/scheduler.py get_init_info: max_total_num_tokens)
FINGERPRINT_KEYS = (
    "version", "tp_size", "max_total_num_tokens", "max_req_input_len", "context_length", "attention_backend",
    "quantization", "kv_cache_dtype", "mem_fraction_static", "speculative_algorithm",
    "speculative_num_draft_tokens", "cuda_graph_max_bs", "disable_cuda_graph",
)  # fmt: skip


def fingerprint_path(spec: Spec) -> str:
    """Where the readiness wait keeps what the server reported (remote/wait_ready.py --fingerprint-file)."""
    return f"{STATE_DIR}/launch/{spec.unit_stem}.json"


def wait_args(spec: Spec) -> list[str]:
    """remote/wait_ready.py's flags that keep the fingerprint once the server serves."""
    return ["--fingerprint-file", fingerprint_path(spec), "--fingerprint-keys", ",".join(FINGERPRINT_KEYS)]


def fingerprint_of(info: dict[str, Any]) -> dict[str, Any]:
    """The kept part of a /server_info answer."""
    return {key: info[key] for key in FINGERPRINT_KEYS if key in info}


def summary(fingerprint: dict[str, Any]) -> str:
    """One line for the run's output and `rollout --status`."""
    shown = ("max_total_num_tokens", "context_length", "attention_backend", "quantization", "speculative_algorithm",
             "cuda_graph_max_bs")
    return ", ".join(f"{key}={fingerprint[key]}" for key in shown if fingerprint.get(key) is not None) or "-"


@dataclass(frozen=True)
class LaunchPlan:
    """What the server must report once it serves."""

    equal: dict[str, Any] = field(default_factory=dict)  # key -> the value the deploy asked for
    kv_tokens: int | None = None  # the memory fit's estimate (capped by --max-total-tokens)
    kv_from: str = ""
    kv_tolerance: float = 0.5  # the pool must hold at least this fraction of kv_tokens
    at_least: dict[str, int] = field(default_factory=dict)  # the profile's minimums (expect:)
    expect_equal: dict[str, Any] = field(default_factory=dict)  # the profile's exact values (expect:)
    warn_only: bool = False  # the profile's expect: on_mismatch: warn (its own expectations only)

    def to_json(self) -> dict[str, Any]:
        return {"equal": self.equal, "kv_tokens": self.kv_tokens, "kv_from": self.kv_from,
                "kv_tolerance": self.kv_tolerance, "at_least": self.at_least, "expect_equal": self.expect_equal,
                "warn_only": self.warn_only}


def launch_plan(spec: Spec, fit: MemoryFit | None) -> LaunchPlan:
    """The plan from the spec (what its command line asks for) and the memory fit (the KV estimate)."""
    equal: dict[str, Any] = {"tp_size": spec.tp_size}
    if spec.attention_backend != "auto":
        equal["attention_backend"] = spec.attention_backend
    if spec.draft is not None:
        equal["speculative_algorithm"] = spec.draft.algorithm
    context = server_arg(spec, "--context-length")
    if context and context.isdigit():
        equal["context_length"] = int(context)
    kv_tokens, kv_from = (fit.kv_tokens, "the memory fit") if fit is not None else (None, "")
    cap = server_arg(spec, "--max-total-tokens")
    if cap and cap.isdigit() and (kv_tokens is None or int(cap) < kv_tokens):
        kv_tokens, kv_from = int(cap), "--max-total-tokens"
    expect = spec.profile.expect
    at_least = {key: value for key, value in (("max_total_num_tokens", expect.min_kv_tokens),
                                              ("context_length", expect.min_context_length)) if value}
    expect_equal = {"attention_backend": expect.attention_backend} if expect.attention_backend else {}
    return LaunchPlan(equal=equal, kv_tokens=kv_tokens, kv_from=kv_from, kv_tolerance=spec.kv_plan_tolerance,
                      at_least=at_least, expect_equal=expect_equal, warn_only=expect.on_mismatch == "warn")


def planned_launch(spec: Spec, gpus: list) -> LaunchPlan:
    """The plan on these GPUs: launch_plan with the memory fit's KV estimate (none when it cannot be known)."""
    return launch_plan(spec, memory_fit(spec, gpus)[0])


def compare(plan: LaunchPlan, fingerprint: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(problems, warnings): each names the key, what the server chose and what was planned."""
    problems: list[str] = []
    own: list[str] = []  # the profile's expectations: warnings with on_mismatch: warn
    for key, wanted in plan.equal.items():
        if key in fingerprint and fingerprint[key] != wanted:
            problems.append(f"{key} is {fingerprint[key]!r}, the deploy asked for {wanted!r}")
    tokens = fingerprint.get("max_total_num_tokens")
    if plan.kv_tokens and isinstance(tokens, int) and tokens < plan.kv_tokens * plan.kv_tolerance:
        problems.append(f"the KV pool holds {tokens} tokens (max_total_num_tokens), below {plan.kv_tolerance:g} x "
                        f"the {plan.kv_tokens} tokens {plan.kv_from} planned ({tokens / plan.kv_tokens:.0%}): GPU "
                        "memory taken by something else at start, or another mem_fraction_static")
    for key, minimum in plan.at_least.items():
        value = fingerprint.get(key)
        if not isinstance(value, int) or value < minimum:
            own.append(f"{key} is {value!r}, the profile expects at least {minimum}")
    for key, wanted in plan.expect_equal.items():
        if fingerprint.get(key) != wanted:
            own.append(f"{key} is {fingerprint.get(key)!r}, the profile expects {wanted!r}")
    return (problems, own) if plan.warn_only else (problems + own, [])


def launch_matches_plan(state, host, spec: Spec, plan: LaunchPlan) -> bool:
    """The readiness step, once the server serves: its kept fingerprint against ``plan``. A problem
    is recorded as the readiness failure (then rolled back like a crash); warnings are printed."""
    found = read_host_json(host, fingerprint_path(spec))
    if not found:
        cause = f"readiness: launch fingerprint: {fingerprint_path(spec)} was not written (see the wait's lines)"
        record_failure(state, host, cause, (cause,), step="readiness")
        host.log_styled(cause, fg="red", log_func=logger.error)
        return False
    problems, warnings = compare(plan, found)
    for line in warnings:
        host.log_styled(f"readiness: WARNING: launch fingerprint: {line}", fg="yellow", log_func=logger.warning)
    if not problems:
        host.log(f"readiness: launch fingerprint as planned: {summary(found)}", logger.warning)
        return True
    return gate_failed(state, host, [f"readiness: launch fingerprint: {line}" for line in problems])
