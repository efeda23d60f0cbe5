"""SIMULATED SGLang server for the sandbox hosts: `python -m sglang_standin ARGS`.

The sandbox hosts have no GPU and no model weights, so their SGLang unit runs
this module instead of `python -m sglang.launch_server`, with the same
arguments (through the same launcher, remote/server_launch.py). It behaves
like SGLang 0.5.23 wherever the deploy can see it, and runs SGLang's own
code from the venv wherever that code runs without a GPU:

1. arguments: SGLang's own parser (`prepare_server_args`, which handles
   `--config FILE.yaml`) when `sglang` is importable, else a small argparse
   that knows the flags the deploy uses (same prog name, same error texts).
   SGLang's parser, resolved_dict() and configure_logger run in a spawned
   child that exits (parse_in_child): they import torch, which the serving
   process then does not hold (a guest's processes: 0.4 GiB RSS, was 1.3);
2. logs: SGLang's own `configure_logger` (sglang/srt/utils/common.py) and
   the line engine.py logs at every start, `server_args={...}` built by
   `redact_watermark_secrets(server_args.resolved_dict())`: like SGLang, the
   API key is in it, in clear (only watermark fields are redacted). Keeping
   it out of the journal is the launcher's job, as on a real host;
3. one process per TP rank, started with multiprocessing "spawn" like
   SGLang's schedulers (sglang/srt/managers/scheduler.py,
   run_scheduler_process); each rank, in SGLang's order:
   - TP memory-balance check (sglang/srt/distributed/bootstrap.py,
     _check_tp_memory_balance) on the free memory all ranks saw before any
     of them allocated;
   - the quantization config: for compressed-tensors, SGLang's own
     `CompressedTensorsConfig._quantization_scheme_map_from_config` and
     `is_activation_quantization_format`, compiled from the installed
     sglang's source files (their package imports CUDA kernels), run against
     the venv's real compressed-tensors (in a child of the rank that exits,
     check_quantization_in_child: it imports torch); without sglang's sources, a model of
     them (quant_scheme_map_model). Under compressed-tensors < 0.10 every
     compressed-tensors model fails: `AttributeError: nvfp4_pack_quantized`;
   - the weights: SGLang's `_prepare_weights` (sglang/srt/model_loader/loader.py)
     with its own `filter_duplicate_safetensors_files` (weight_utils.py) for
     the shards model.safetensors.index.json names; then every shard's header
     is read with the real `safetensors.safe_open` where installed, else the
     model of it (safetensors_header_model): a missing or truncated shard
     fails the start, and so does a model dir without weights;
   - with --speculative-algorithm and --speculative-draft-model-path (an EAGLE3
     draft model), the draft worker's load the same way after the target's:
     its config.json, then its weights' headers; a missing draft dir, config
     or weights fails the start like the target's would (load_draft);
   - "Not enough memory" against the simulated free memory, then the rank
     holds mem_fraction_static x its GPU (sandbox/gpusim.py) for its own PID;
   a failing rank logs "Scheduler hit an exception: <traceback>" and sends
   SIGQUIT to the main process, which kills the tree and itself (SIGKILL),
   like SGLang's launch-phase SIGQUIT handler (engine.py); a rank that dies
   later is noticed within a second (sglang/srt/utils/watchdog.py,
   SubprocessWatchdog) with the same end;
4. HTTP (stdlib), started once the ranks are up (no answer while loading, like
   sglang 0.5.23): /health* 503 until the warmup is done, then 200, /v1/models,
   /server_info (and /get_server_info: the arguments under SGLang's own
   names, the speculative_* settings included), /model_info, /v1/loads, /version, /metrics,
   /generate, /v1/chat/completions (plain and SSE), /v1/completions,
   --api-key enforced like SGLang;
   SIGTERM as SGLang 0.5.23 meets it (sandbox/sglang_sigterm.py): while loading
   the default action; from the warmup request on, SGLang's handler logs
   "SIGTERM received. ..." and its watchdog, polling every 5 s from that
   request, drains the requests ("Gracefully exiting... Remaining number of
   requests N. ..."), with /health 503 meanwhile, stops the ranks, exit 0.
   The ranks have no SIGTERM handler: SIGTERM to all (KillMode=control-group;
   the deploy's unit has KillMode=mixed) kills them, then the watchdog below ends the main process;
5. multi-node (--nnodes N): ranks really rendezvous over TCP at
   --dist-init-addr; rank 0 is ready only when all ranks joined and every
   node's ranks loaded (its KV pool the smallest of theirs); ranks
   >= 1 serve only SGLang's dummy health server (/health, /health_generate,
   /ping) like SGLang 0.5.23 does;
6. the first log line says this is a simulation.

Stdlib only, apart from what it finds in the running venv: sglang (parser,
logger, source files), compressed_tensors, safetensors and yaml (--config).

Environment (all optional):
  SANDBOX_LOAD_SECONDS      simulated load + warmup time, float, default 3
  SANDBOX_GEN_DELAY_S       time each generation request takes, default 0.05
  SANDBOX_KV_FRACTION       the KV pool is this fraction of what the memory
                            leaves (a fault: a pool far smaller than planned)
  SANDBOX_HANG_RANK         this TP rank hangs after "Load weight begin." and
                            logs nothing more (a fault: the start stalls)
  SANDBOX_GIBBERISH=1       every answer is junk while /health stays 200 (a
                            fault: up but broken; the smoke checks catch it)
  SANDBOX_GRAPH_OOM_RANK    this TP rank ("all": every rank) runs out of GPU
                            memory capturing its CUDA graphs, with SGLang's and
                            torch's own message (a fault: memory sized too tight)
  SANDBOX_DRAFT_ACCEPT      with --speculative-algorithm: the simulated accept
                            length /generate reports (spec_* meta_info) and
                            /metrics shows, default 2.6 (a fault: 1.0, every
                            draft token rejected)
  SANDBOX_SGLANG_PARSER     auto (default) | real | fallback
  SANDBOX_SGLANG_SRC        the sglang package directory whose source files
                            the checks run (default: the importable sglang's)
  SANDBOX_DIST_WAIT_S       how long rank 0 waits for the other ranks when
                            --dist-timeout is not given, default 600
  SANDBOX_NONZERO_SIGTERM_WAIT_S
                            ranks >= 1 ignore SIGTERM (like SGLang: they wait
                            for rank 0's shutdown); after this many seconds
                            they exit 0 anyway. Default: wait forever.
  SANDBOX_GPU_LAYOUT, SANDBOX_GPU_REGISTRY   (read by gpusim)
  SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=0  turns the balance check into a
                            warning, like SGLang
  SGLANG_LOG_MS=1           milliseconds in log timestamps, like SGLang
  CUDA_VISIBLE_DEVICES      physical GPU indices (or UUIDs), comma separated
"""

from __future__ import annotations

import __future__
import argparse
import ast
import builtins
import ctypes
import dis
import glob
import importlib
import importlib.util
import json
import logging
import math
import multiprocessing
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import types
import typing
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import standin_cache
from sglang_sigterm import Lifecycle

SIMULATION_BANNER = "SIMULATED SGLang server (sandbox stand-in): no GPU, no real model weights"
READY_LINE = "The server is fired up and ready to roll!"
FALLBACK_VERSION = "0.5.23"
DEFAULT_MEM_FRACTION = 0.85

# sglang 0.5.23 ATTENTION_BACKEND_CHOICES, in its order (argparse prints them so)
ATTENTION_BACKEND_CHOICES = [
    "triton", "torch_native", "flex_attention", "dsa", "nsa", "qsa", "dsv4",
    "compressed", "fa3", "fa4", "flashinfer", "llada2_cfg_flashinfer", "flashmla",
    "trtllm_mla", "cutedsl_mla", "tokenspeed_mla", "trtllm_mha", "hpc_ops",
    "minicpm_flashattn", "minicpm_flashinfer", "aiter", "wave", "intel_amx",
    "ascend", "intel_xpu",
]

# The sglang 0.5.23 source files (relative to the sglang package) whose code
# the checks run, and the functions taken from them.
CT_UTILS_FILE = "srt/layers/quantization/compressed_tensors/utils.py"
CT_CONFIG_FILE = "srt/layers/quantization/compressed_tensors/compressed_tensors.py"
WEIGHT_UTILS_FILE = "srt/model_loader/weight_utils.py"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"  # sglang/srt/model_loader/loader.py

_print_lock = threading.Lock()


# --------------------------------------------------------------------------
# logging, SGLang's: "[2025-01-01 12:00:00 TP0] message" on stderr
# --------------------------------------------------------------------------

_logger = logging.getLogger("sglang.srt.entrypoints.http_server")
_engine_logger = logging.getLogger("sglang.srt.entrypoints.engine")  # the server_args line's logger
_scheduler_logger = logging.getLogger("sglang.srt.managers.scheduler")


def configure_logging(log_level: str = "info", prefix: str = "", server_args=None) -> str:
    """SGLang's configure_logger(server_args, prefix) when sglang's utils import
    here (what it returns: "sglang"), else the same basicConfig ("model").

    Model of sglang 0.5.23 srt/utils/common.py configure_logger: root logger,
    format "[%(asctime)s{.msecs if SGLANG_LOG_MS}{prefix}] %(message)s",
    datefmt "%Y-%m-%d %H:%M:%S", force=True, stderr."""
    if server_args is not None:
        try:
            from sglang.srt.utils.common import configure_logger

            configure_logger(server_args, prefix=prefix)
            return "sglang"
        except Exception:  # noqa: BLE001 - a partial sglang install: the model below
            pass
    maybe_ms = ".%(msecs)03d" if os.environ.get("SGLANG_LOG_MS", "").strip().lower() in ("1", "true") else ""
    logging.basicConfig(
        level=getattr(logging, str(log_level or "info").upper(), logging.INFO),
        format=f"[%(asctime)s{maybe_ms}{prefix}] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        force=True,
    )
    return "model"


def log(msg: str, err: bool = False, logger: logging.Logger | None = None) -> None:
    """One log line through logging (SGLang's format); err: at ERROR."""
    (logger or _logger).log(logging.ERROR if err else logging.INFO, msg)


def raw(msg: str, err: bool = False) -> None:
    """A line outside logging (uvicorn's own lines)."""
    stream = sys.stderr if err else sys.stdout
    with _print_lock:
        print(msg, file=stream, flush=True)


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "")
    try:
        return float(value) if value.strip() else default
    except ValueError:
        return default


def get_exception_traceback() -> str:
    """sglang 0.5.23 sglang/utils.py get_exception_traceback: format_exception of the current exception."""
    etype, value, tb = sys.exc_info()
    return "".join(traceback.format_exception(etype, value, tb))


# --------------------------------------------------------------------------
# 1. arguments
# --------------------------------------------------------------------------


class Args:
    """The settings the stand-in uses, from either parser."""

    def __init__(self, source, parser_kind: str, resolved: dict | None = None):
        self.source = source
        self.parser_kind = parser_kind
        self._logged: dict | None = None
        # from a parse child (parse_in_child): the server_args= text and /server_info fields, already resolved
        self._resolved = resolved
        g = lambda name, default=None: getattr(source, name, default)  # noqa: E731
        self.model_path = g("model_path")
        self.tp_size = int(g("tp_size") or 1)
        self.host = g("host") or "127.0.0.1"
        self.port = int(g("port") or 30000)
        self.api_key = g("api_key")
        self.served_model_name = g("served_model_name") or self.model_path
        mfs = g("mem_fraction_static")
        self.mem_fraction_static = (
            float(mfs) if isinstance(mfs, (int, float)) and 0 < mfs <= 1 else DEFAULT_MEM_FRACTION
        )
        self.mem_fraction_explicit = isinstance(mfs, (int, float))
        self.context_length = g("context_length")
        self.nnodes = int(g("nnodes") or 1)
        self.node_rank = int(g("node_rank") or 0)
        self.dist_init_addr = g("dist_init_addr")
        self.dist_timeout = g("dist_timeout")
        self.enable_metrics = bool(g("enable_metrics", False))
        self.skip_server_warmup = bool(g("skip_server_warmup", False))
        self.attention_backend = g("attention_backend")
        self.base_gpu_id = int(g("base_gpu_id") or 0)
        self.tool_call_parser = g("tool_call_parser")
        self.reasoning_parser = g("reasoning_parser")
        self.log_level = g("log_level") or "info"
        self.speculative_algorithm = g("speculative_algorithm")
        self.speculative_draft_model_path = g("speculative_draft_model_path")

    def fields(self) -> dict:
        src = self.source
        if hasattr(src, "__struct_fields__"):  # sglang 0.5.23: msgspec.Struct
            names = list(src.__struct_fields__)
        elif hasattr(src, "__dataclass_fields__"):  # older sglang: dataclass
            names = list(src.__dataclass_fields__)
        else:
            names = list(vars(src))
        out = {}
        for name in names:
            if name.startswith("_"):
                continue
            out[name] = getattr(src, name, None)  # api_key included, like SGLang
        return out

    def for_logging(self) -> dict:
        """What SGLang 0.5.23 logs as server_args= and serves as /server_info:
        engine.py _server_args_for_logging = redact_watermark_secrets(
        server_args.resolved_dict()), run here when sglang parsed the
        arguments; only watermark fields are redacted, the API key is not.
        With the fallback parser: its fields, unredacted too."""
        if self._logged is None:
            self._logged = self._for_logging()
        return self._logged

    def _for_logging(self) -> dict:
        if self.parser_kind == "sglang":
            try:
                from sglang.srt.sampling.watermarking.core import redact_watermark_secrets

                return redact_watermark_secrets(self.source.resolved_dict())
            except Exception as e:  # noqa: BLE001 - resolution needs what this venv may lack
                log(f"(stand-in) ServerArgs.resolved_dict() failed here ({type(e).__name__}: {e}); "
                    "logging the parsed fields instead")
        return self.fields()

    def logged_text(self) -> str:
        """The server_args= line's value (the repr SGLang's f-string gives)."""
        return self._resolved["logged"] if self._resolved else str(self.for_logging())

    def light_attrs(self) -> dict:
        """The settings above as plain data (what a parse child sends back)."""
        return {name: getattr(self.source, name, None) for name in ARG_NAMES}

    def json_fields(self) -> dict:
        if self._resolved:
            return self._resolved["json_fields"]
        out = {}
        for k, v in self.for_logging().items():
            try:
                json.dumps(v)
                out[k] = v
            except (TypeError, ValueError):
                out[k] = repr(v)
        return out


def _merge_config(argv: list[str], store_true: set[str]) -> list[str]:
    """SGLang's ConfigArgumentMerger: YAML keys become `--key value`, placed
    before the command-line arguments (CLI > config > defaults)."""
    idx = [i for i, a in enumerate(argv) if a == "--config"]
    if not idx:
        return argv
    if len(idx) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    i = idx[0]
    if i == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    path = Path(argv[i + 1])
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {path.suffix}")
    if not path.exists():
        raise ValueError(f"Config file not found: {path}")
    import yaml  # like SGLang: --config needs pyyaml

    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    cfg: list[str] = []
    for key, value in data.items():
        if isinstance(value, bool):
            if key.replace("-", "_") in store_true:
                if value:
                    cfg.append(f"--{key}")
            else:
                cfg.extend([f"--{key}", str(value).lower()])
        elif isinstance(value, list):
            if value:
                cfg.append(f"--{key}")
                cfg.extend(str(item) for item in value)
        elif isinstance(value, dict):
            cfg.extend([f"--{key}", json.dumps(value)])
        else:
            cfg.extend([f"--{key}", str(value)])
    return cfg + argv[:i] + argv[i + 2 :]


def fallback_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang serve")
    p.add_argument("--model-path", "--model", type=str, required=True)
    p.add_argument("--tokenizer-path", type=str)
    p.add_argument("--config", type=str)
    p.add_argument("--tp-size", "--tensor-parallel-size", "--tp", type=int, default=1)
    p.add_argument("--dp-size", "--data-parallel-size", type=int, default=1)
    p.add_argument("--attention-backend", type=str, choices=ATTENTION_BACKEND_CHOICES)
    p.add_argument("--host", type=str, default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--served-model-name", type=str)
    p.add_argument("--api-key", type=str)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--context-length", type=int)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", "--nccl-init-addr", type=str)
    p.add_argument("--dist-timeout", type=int)
    p.add_argument("--base-gpu-id", type=int, default=0)
    p.add_argument("--tool-call-parser", type=str)
    p.add_argument("--reasoning-parser", type=str)
    p.add_argument("--skip-server-warmup", action="store_true")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--watchdog-timeout", type=float, default=300)
    p.add_argument("--log-level", type=str, default="info")
    p.add_argument("--speculative-algorithm", type=str)
    p.add_argument("--speculative-draft-model-path", type=str)
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    return p


def parse_args(argv: list[str]) -> Args:
    mode = os.environ.get("SANDBOX_SGLANG_PARSER", "auto").strip().lower() or "auto"
    use_real = mode == "real" or (mode == "auto" and importlib.util.find_spec("sglang") is not None)
    if use_real:
        return parse_in_child(argv)
    parser = fallback_parser()
    store_true = {
        a.dest for a in parser._actions if isinstance(a, argparse._StoreTrueAction)
    }
    if "--config" in argv:
        argv = _merge_config(argv, store_true)
    ns = parser.parse_args(argv)
    return Args(ns, "fallback")




# The names Args reads from either parser's result.
ARG_NAMES = (
    "model_path", "tp_size", "host", "port", "api_key", "served_model_name", "mem_fraction_static",
    "context_length", "nnodes", "node_rank", "dist_init_addr", "dist_timeout", "enable_metrics",
    "skip_server_warmup", "attention_backend", "base_gpu_id", "tool_call_parser", "reasoning_parser",
    "log_level", "speculative_algorithm", "speculative_draft_model_path",
)


def parse_in_child(argv: list[str]) -> Args:
    """SGLang's real parser, resolved_dict() and configure_logger, run in a spawned child that
    exits afterwards. What they import (torch, ~350 MB) then does not stay in the server process
    for its whole life; nothing the deploy can see changes. The child writes to the same stderr:
    argparse's usage and error (exit 2) or a traceback (exit 1) are the server's own, and the
    server exits with the child's code, as SGLang's main process would have. In a sandbox guest
    the outcome of the same inputs is replayed from the last such start (standin_cache)."""
    key = hidden = None
    if standin_cache.enabled():
        import gpusim

        key = standin_cache.parser_key(argv, gpusim.LAYOUT_PATH)
        hidden = standin_cache.secrets(argv)
        record = standin_cache.load(key, hidden)
        if record is not None:
            return _parse_outcome(record, reused=True)
    capture = [f"/tmp/.sglang-standin-parse-{os.getpid()}.{n}" for n in ("out", "err")] if key else None
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    target = importlib.import_module("sglang_standin")._parse_child  # by its own name, as Ranks does
    child = ctx.Process(target=target, args=(argv, sender, capture), name="parse_server_args")
    child.start()
    sender.close()
    try:
        reply = receiver.recv()
    except EOFError:
        reply = None
    child.join()
    record = {"exitcode": child.exitcode if reply is None else 0, "reply": reply, "stdout": "", "stderr": ""}
    for name, path in zip(("stdout", "stderr"), capture or [], strict=False):
        try:
            record[name] = Path(path).read_text(errors="replace")
            os.unlink(path)
        except OSError:
            pass
    if reply is not None:  # a parse (a refusal or a crash is always run again: the child says why)
        standin_cache.store(key, {**record, "imported": reply.pop("imported", {})}, hidden or [])
    return _parse_outcome(record, reused=False)


def _parse_outcome(record: dict, reused: bool) -> Args:
    """The child's output (when it was captured), then its exit or its parse."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if record[name]:
            os.write(fd, record[name].encode())
    reply = record["reply"]
    if reply is None:
        code = record["exitcode"]
        _hard_exit(code if code and code > 0 else 1)
    _apply_logging(reply["logging"])
    if reused:
        log("(stand-in) SGLang's parser not run again: this start's arguments, environment, venv and model "
            "config are those of an earlier start in this sandbox guest; its outcome replayed")
    source = types.SimpleNamespace(**reply["attrs"])
    return Args(source, "sglang", resolved={"logged": reply["logged"], "json_fields": reply["json_fields"]})


def _parse_child(argv: list[str], conn, capture: list[str] | None = None) -> None:
    if capture:  # the parent replays it (and keeps it for the next start with the same inputs)
        for fd, path in zip((1, 2), capture, strict=True):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    configure_logging()
    try:
        # an importable but broken sglang fails here, as the real server would
        from sglang.srt.server_args import prepare_server_args

        server_args = prepare_server_args(argv)
        args = Args(server_args, "sglang")
        configure_logging(args.log_level, server_args=server_args)
        conn.send({"attrs": args.light_attrs(), "logged": str(args.for_logging()),
                   "json_fields": args.json_fields(), "logging": _logging_state(),
                   "imported": standin_cache.imported_files() if capture else {}})
    except SystemExit:
        raise  # argparse said why on stderr
    except Exception:  # noqa: BLE001 - anything SGLang's main would die of
        traceback.print_exc()  # what an uncaught exception in SGLang's main process prints
        sys.stderr.flush()
        os._exit(1)


def _logging_state() -> dict:
    """What configure_logger left on the root logger (or the dictConfig file it applied)."""
    root = logging.getLogger()
    handler = root.handlers[0] if root.handlers else None
    formatter = handler.formatter if handler else None
    return {"config_path": os.getenv("SGLANG_LOGGING_CONFIG_PATH") or None, "level": root.level,
            "format": formatter._fmt if formatter else None, "datefmt": formatter.datefmt if formatter else None,
            "stdout": getattr(handler, "stream", None) is sys.stdout}


def _apply_logging(state: dict) -> None:
    if state["config_path"]:  # configure_logger: dictConfig of that file (orjson there, same JSON)
        from logging import config as logging_config

        logging_config.dictConfig(json.loads(Path(state["config_path"]).read_text(encoding="utf-8")))
        return
    logging.basicConfig(level=state["level"], format=state["format"], datefmt=state["datefmt"],
                        stream=sys.stdout if state["stdout"] else sys.stderr, force=True)


# --------------------------------------------------------------------------
# SGLang's own code, from the installed sglang's source files
# --------------------------------------------------------------------------


def sglang_src_dir() -> Path | None:
    """The sglang package directory whose files the checks run (SANDBOX_SGLANG_SRC,
    else the importable sglang's), found without importing sglang."""
    override = os.environ.get("SANDBOX_SGLANG_SRC", "").strip()
    if override:
        return Path(override)
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


def load_upstream_module(rel: str, name: str) -> types.ModuleType | None:
    """One sglang source file run as a module of its own (its package's
    __init__, which imports CUDA kernels, is not run); None without sglang's sources."""
    root = sglang_src_dir()
    path = root / rel if root else None
    if path is None or not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its own imports fail here as they would in SGLang
    return module


def upstream_function(rel: str, qualname: str, namespace: dict) -> types.FunctionType | None:
    """One function (``func`` or ``Class.method``) compiled from an sglang
    source file's own text into ``namespace``, for files whose imports pull
    in CUDA code. None without the file, the function, or a name it uses."""
    root = sglang_src_dir()
    path = root / rel if root else None
    if path is None or not path.is_file():
        return None
    body: list = ast.parse(path.read_text(), str(path)).body
    node = None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        if node is None:
            return None
        body = node.body
    if not isinstance(node, ast.FunctionDef):
        return None
    node.decorator_list = []  # classmethod/staticmethod: called with cls=None
    code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    scope = dict(namespace)
    exec(code, scope)  # noqa: S102 - SGLang's own source, from the venv
    fn = scope[node.name]
    missing = [n for n in _global_names(fn.__code__) if n not in scope and not hasattr(builtins, n)]
    return None if missing else fn


def _global_names(code: types.CodeType) -> set[str]:
    """The global names a function's code reads (nested code included)."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


# --------------------------------------------------------------------------
# 2. model: config, quantization, weights
# --------------------------------------------------------------------------


def load_model_config(model_path: str) -> dict:
    path = Path(model_path) / "config.json"
    if not path.is_file():
        raise OSError(
            f"Can't load the configuration of '{model_path}'. Make sure that '{model_path}' "
            "is the correct path to a directory containing a config.json file"
        )
    return json.loads(path.read_text())


def is_activation_quantization_format_model(format: str) -> bool:  # noqa: A002 - upstream's name
    """Model of sglang 0.5.23 srt/layers/quantization/compressed_tensors/utils.py
    is_activation_quantization_format(), used where sglang's sources are not
    installed: the list is built at every call from five members, so a
    compressed-tensors release without nvfp4_pack_quantized (< 0.10) raises
    AttributeError for any format. tests/unit/test_conformance.py checks it
    against the real function."""
    from compressed_tensors import CompressionFormat

    _ACTIVATION_QUANTIZATION_FORMATS = [  # noqa: N806 - upstream's name
        CompressionFormat.naive_quantized.value,
        CompressionFormat.int_quantized.value,
        CompressionFormat.float_quantized.value,
        CompressionFormat.nvfp4_pack_quantized.value,
        CompressionFormat.pack_quantized.value,
    ]
    return format in _ACTIVATION_QUANTIZATION_FORMATS


def quant_scheme_map_model(cls, config: dict, is_activation_quantization_format=None) -> dict:
    """Model of sglang 0.5.23 srt/layers/quantization/compressed_tensors/
    compressed_tensors.py CompressedTensorsConfig._quantization_scheme_map_from_config
    (the first thing from_config does), with the venv's real QuantizationArgs:
    per config group and target, the weights are validated, then the group's
    format (else the model's) goes through is_activation_quantization_format."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationType

    check = is_activation_quantization_format or is_activation_quantization_format_model
    target_scheme_map: dict = {}
    quant_format = config.get("format")
    for _, quant_config in config.get("config_groups", dict()).items():
        for target in quant_config.get("targets"):
            target_scheme_map[target] = {
                "weights": QuantizationArgs.model_validate(quant_config.get("weights")),
                "input_activations": None,
            }
            group_format = quant_config.get("format")
            target_scheme_map[target]["format"] = group_format
            if check(group_format if group_format is not None else quant_format):
                input_activations = quant_config.get("input_activations")
                if not input_activations:
                    weight_type = target_scheme_map[target]["weights"].type
                    if weight_type != QuantizationType.INT:
                        assert weight_type == QuantizationType.FLOAT
                else:
                    target_scheme_map[target]["input_activations"] = QuantizationArgs.model_validate(
                        input_activations
                    )
    return target_scheme_map


def compressed_tensors_checker() -> tuple[typing.Callable[[dict], dict], str]:
    """The function that checks a compressed-tensors quantization_config the
    way SGLang does, and where it comes from: SGLang's own code when its
    source files are installed ("sglang"), else the model ("model")."""
    utils = load_upstream_module(CT_UTILS_FILE, "sglang_standin_upstream_ct_utils")
    if utils is not None:
        from compressed_tensors.quantization import QuantizationArgs, QuantizationType

        namespace = {"cast": typing.cast, "QuantizationArgs": QuantizationArgs, "QuantizationType": QuantizationType,
                     "is_activation_quantization_format": utils.is_activation_quantization_format}
        fn = upstream_function(CT_CONFIG_FILE, "CompressedTensorsConfig._quantization_scheme_map_from_config",
                               namespace)
        if fn is not None:
            return (lambda config: fn(None, config)), "sglang"
        return (lambda config: quant_scheme_map_model(
            None, config, utils.is_activation_quantization_format)), "sglang utils + model"
    return (lambda config: quant_scheme_map_model(None, config)), "model"


def check_quantization(config: dict, announce: typing.Callable[[str], None] | None = None) -> tuple[str, str]:
    """(quant_method, where the check came from); raises what SGLang raises.
    announce(source) is called before the check runs."""
    qc = config.get("quantization_config") or {}
    method = qc.get("quant_method")
    source = ""
    if method == "compressed-tensors":
        check, source = compressed_tensors_checker()
        if announce is not None:
            announce(source)
        check(qc)
    return method or "", source


class SafetensorError(Exception):
    """safetensors' exception, as tracebacks name it (safetensors 0.8.0)."""


SafetensorError.__module__ = "safetensors._safetensors_rust"
SAFETENSORS_MAX_HEADER = 100_000_000
# safetensors 0.8.0 dtype sizes in bits (sub-byte types: F4, F6_*)
_ST_DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
    "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}


def safetensors_header_model(path: str) -> list[str]:
    """Model of safetensors 0.8.0 safe_open's header validation (Rust:
    safetensors/src/tensor.rs, SafeTensors::read_metadata and
    Metadata::validate), for venvs without safetensors: the tensor names, or
    SafetensorError with its message. Checked against the real package
    (tests/unit/test_conformance.py) for truncated, empty, cut-header and
    bad-offset files; serde's JSON error texts are not reproduced."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise SafetensorError("Error while deserializing header: header too small")
        n = struct.unpack("<Q", head)[0]
        if n > SAFETENSORS_MAX_HEADER:
            raise SafetensorError("Error while deserializing header: header too large")
        if n + 8 > size:
            raise SafetensorError("Error while deserializing header: invalid header length")
        raw_header = f.read(n)
    try:
        header = json.loads(raw_header.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise SafetensorError(f"Error while deserializing header: invalid UTF-8 in header: {e}") from None
    except ValueError as e:
        raise SafetensorError(f"Error while deserializing header: invalid JSON in header: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorError("Error while deserializing header: invalid JSON in header: not a map")
    tensors = sorted(((k, v) for k, v in header.items() if k != "__metadata__"),
                     key=lambda kv: tuple((kv[1] or {}).get("data_offsets") or (0, 0)))
    start = 0
    for name, info in tensors:
        try:
            begin, end = info["data_offsets"]
            bits = _ST_DTYPE_BITS[info["dtype"]]
            count = 1
            for d in info["shape"]:
                count *= int(d)
        except (KeyError, TypeError, ValueError):
            raise SafetensorError("Error while deserializing header: invalid JSON in header") from None
        if begin != start or end < begin:
            raise SafetensorError(f"Error while deserializing header: invalid offset for tensor `{name}`")
        if count * bits % 8 or end - begin != count * bits // 8:
            raise SafetensorError(
                "Error while deserializing header: invalid shape, data type, or offset for tensor")
        start = end
    if start + 8 + n != size:
        raise SafetensorError("Error while deserializing header: incomplete metadata, file not fully covered")
    return [name for name, _ in tensors]


def open_safetensors(path: str) -> list[str]:
    """A shard's tensor names, its header checked as SGLang's loader does
    (safetensors.safe_open, the real one when installed; else the model)."""
    try:
        from safetensors import safe_open
    except ImportError:
        return safetensors_header_model(path)
    with safe_open(path, framework="numpy") as f:  # the header only: no framework import
        return list(f.keys())


def filter_duplicate_safetensors_files_model(hf_weights_files: list[str], hf_folder: str, index_file: str,
                                             allow_patterns=None) -> list[str]:
    """Model of sglang 0.5.23 srt/model_loader/weight_utils.py
    filter_duplicate_safetensors_files, local dirs (used without sglang's sources)."""
    index_file_name = os.path.join(hf_folder, index_file)
    if not os.path.isfile(index_file_name):
        return hf_weights_files
    with open(index_file_name) as f:
        weight_map = json.load(f)["weight_map"]
    weight_files_in_index = {os.path.join(hf_folder, weight_map[name]) for name in weight_map}
    missing_files = sorted(f for f in weight_files_in_index if not os.path.isfile(f))
    if missing_files:
        raise RuntimeError(
            f"{index_file} references {len(missing_files)} shard file(s) missing "
            f"from {hf_folder} (incomplete download?): "
            f"{[os.path.basename(f) for f in missing_files]}"
        )
    return [f for f in hf_weights_files if f in weight_files_in_index]


def weight_files_filter() -> tuple[typing.Callable, str]:
    """SGLang's filter_duplicate_safetensors_files from its source ("sglang"), else the model."""
    import fnmatch

    fn = upstream_function(WEIGHT_UTILS_FILE, "filter_duplicate_safetensors_files",
                           {"os": os, "json": json, "fnmatch": fnmatch})
    if fn is not None:
        return fn, "sglang"
    return filter_duplicate_safetensors_files_model, "model"


def prepare_weights(model_path: str) -> tuple[list[str], str]:
    """The weight files SGLang would load from a local model dir, load_format
    auto (model of sglang 0.5.23 srt/model_loader/loader.py
    DefaultModelLoader._prepare_weights: *.safetensors, else *.bin; the index
    filter; "Cannot find any model weights"), sorted, and the filter's source."""
    hf_weights_files: list[str] = []
    use_safetensors = False
    for pattern in ("*.safetensors", "*.bin"):
        hf_weights_files += glob.glob(os.path.join(model_path, pattern))
        if hf_weights_files:
            use_safetensors = pattern.endswith(".safetensors")
            break
    source = ""
    if use_safetensors:
        filter_fn, source = weight_files_filter()
        hf_weights_files = filter_fn(hf_weights_files, model_path, SAFE_WEIGHTS_INDEX_NAME)
    if len(hf_weights_files) == 0:
        raise RuntimeError(f"Cannot find any model weights with `{model_path}`")
    return sorted(hf_weights_files), source


# --------------------------------------------------------------------------
# 3. GPUs
# --------------------------------------------------------------------------


def _import_gpusim():
    try:
        import gpusim  # /usr/local/lib/sandbox-gpu on the sandbox hosts
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import gpusim
    return gpusim


def select_gpus(layout: dict, args: Args) -> list[dict]:
    """This node's GPUs: gpus_per_node of CUDA_VISIBLE_DEVICES, from base_gpu_id."""
    gpus = layout.get("gpus") or []
    if not gpus:
        raise RuntimeError("No CUDA GPUs are available")
    by_index = {g["index"]: g for g in gpus}
    by_uuid = {g.get("uuid"): g for g in gpus}
    visible_env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible_env is None:
        visible = list(gpus)
    else:
        visible = []
        for item in (x.strip() for x in visible_env.split(",")):
            if not item:
                continue
            if item in by_uuid:
                visible.append(by_uuid[item])
            elif item.lstrip("-").isdigit() and int(item) in by_index:
                visible.append(by_index[int(item)])
            else:
                break  # CUDA stops at the first invalid entry
        if not visible:
            raise RuntimeError("No CUDA GPUs are available")
    per_node = max(1, args.tp_size // max(1, args.nnodes))
    wanted = visible[args.base_gpu_id : args.base_gpu_id + per_node]
    if len(wanted) < per_node:
        raise RuntimeError(
            "CUDA error: invalid device ordinal "
            f"(tp_size={args.tp_size} needs {per_node} GPUs on this node, "
            f"{len(visible)} visible: CUDA_VISIBLE_DEVICES={visible_env!r})"
        )
    return wanted



def check_tp_memory_balance(*, pre_model_load_memory: float, local_gpu_memory: float) -> None:
    """Model of sglang 0.5.23 srt/distributed/bootstrap.py _check_tp_memory_balance (GB values)."""
    if pre_model_load_memory < local_gpu_memory * 0.9:
        msg = "The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
        msg += f"{pre_model_load_memory=}, {local_gpu_memory=}, {local_gpu_memory * 0.9=}"
        if os.environ.get("SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK", "1").strip().lower() in (
            "0", "false", "no", "off",
        ):
            _scheduler_logger.warning(msg)
        else:
            raise RuntimeError(msg)


# --------------------------------------------------------------------------
# 3b. TP ranks: one process each, like SGLang's scheduler processes
# --------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Like SGLang's kill_itself_when_parent_died: PR_SET_PDEATHSIG = SIGKILL."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def run_rank(cfg: dict, conn) -> None:
    """One TP rank's process (SGLang: run_scheduler_process in
    srt/managers/scheduler.py): initialise, say "ready" through the pipe,
    then hold the GPU memory until the main process says "shutdown" or goes
    away. A failure is logged as "Scheduler hit an exception: <traceback>" and
    SIGQUIT goes to the main process, as in SGLang."""
    _die_with_parent()
    # SIGTERM: the default action, as SGLang's schedulers install no handler (scheduler.py;
    # mem_cache/allocator/unified_sub_pool.py says so). Under KillMode=control-group (not the
    # deploy's unit: it has mixed) systemd sends it to every process at once: the ranks die, the main process's
    # SubprocessWatchdog (start_watchdog) sees it and SIGQUITs itself, no drain.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(cfg["log_level"], prefix=f" TP{cfg['tp_rank']}")
    gpusim = _import_gpusim()
    try:
        info = _rank_init(cfg, gpusim)
        conn.send({"status": "ready", **info})
    except Exception as exc:  # noqa: BLE001 - SGLang's scheduler catches everything here too
        text = exc.traceback_text if isinstance(exc, CheckChildFailed) else get_exception_traceback()
        _scheduler_logger.error(f"Scheduler hit an exception: {text}")
        os.kill(cfg["parent_pid"], signal.SIGQUIT)
        return
    try:
        while conn.recv() != "shutdown":
            pass
    except (EOFError, OSError):
        pass
    finally:
        gpusim.unregister(os.getpid())


def _rank_init(cfg: dict, gpusim) -> dict:
    """A rank's start, in SGLang's order: memory balance, quantization config,
    weights, memory pool. Returns what the rank tells the main process."""
    gpu, load_seconds = cfg["gpu"], cfg["load_seconds"]
    idx = gpu["index"]
    free = {int(k): v for k, v in cfg["free_mib"].items()}
    # the start lines are sglang 0.5.23's own (remote/wait_ready.py PHASES cites each file)
    log("Init parallel begin.", logger=_scheduler_logger)
    if cfg["tp_size"] > 1:
        check_tp_memory_balance(pre_model_load_memory=min(free.values()) / 1024,
                                local_gpu_memory=free[idx] / 1024)
    log("Init parallel ends. elapsed=0.01 s", logger=_scheduler_logger)
    log("Memory baseline taken. mem usage=0.00 GB", logger=_scheduler_logger)
    avail = free[idx] / 1024
    log(f"Load weight begin. avail mem={avail:.2f} GB", logger=_scheduler_logger)
    if os.environ.get("SANDBOX_HANG_RANK") == str(cfg["tp_rank"]):
        threading.Event().wait()  # a rank stuck in loading without a line (a hung NFS read, an NCCL deadlock)
    model_config = load_model_config(cfg["model_path"])
    quant = (model_config.get("quantization_config") or {}).get("quant_method") or ""
    if cfg["local_rank"] == 0:  # once per node: each check imports torch (SGLang: every rank)
        quant = check_quantization_in_child(model_config, cfg)
    files, filter_source = prepare_weights(cfg["model_path"])
    tensors = sum(len(open_safetensors(f)) for f in files if f.endswith(".safetensors"))
    if cfg.get("draft_model_path"):  # SGLang's draft worker loads after the target's, on every rank
        load_draft(cfg["draft_model_path"], cfg.get("speculative_algorithm"))
    time.sleep(load_seconds * 0.6)
    hold = int(cfg["mem_fraction_static"] * gpu["memory_total_mib"])
    held = hold / 1024
    # the rank's share of the checkpoint, placed tensor by tensor as SGLang holds it (the memory plan's
    # own rules: core/tensor_plan.py, copied beside this file), else the files' bytes over TP
    weights = rank_weight_bytes(files, model_config, cfg["tp_size"]) / 2**30
    arch = (model_config.get("architectures") or ["?"])[0]
    quant_str = f"quant={quant}, " if quant else ""
    log(f"Load weight end. elapsed={load_seconds * 0.6:.2f} s, type={arch}, {quant_str}"
        f"avail mem={avail - weights:.2f} GB, mem usage={weights:.2f} GB. "
        f"({len(files)} weight file(s), {tensors} tensors; index filter: {filter_source or '-'})",
        logger=_scheduler_logger)
    if hold > free[idx]:
        raise RuntimeError(
            "Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: mem_fraction_static={cfg['mem_fraction_static']}"
        )
    gpusim.register(os.getpid(), {idx: hold}, name="python3")
    tokens, kv = kv_pool_tokens(model_config, cfg, avail, weights)
    log(f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {tokens}, KV size: {kv:.2f} GB",
        logger=_scheduler_logger)
    log(f"Memory pool end. avail mem={avail - held:.2f} GB", logger=_scheduler_logger)
    log(f"Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem={avail - held:.2f} GB",
        logger=_scheduler_logger)
    time.sleep(load_seconds * 0.3)
    if os.environ.get("SANDBOX_GRAPH_OOM_RANK") in (str(cfg["tp_rank"]), "all"):
        raise Exception(f"Capture cuda graph failed: {_graph_oom(gpu, hold)}\n{CUDA_GRAPH_CAPTURE_FAILED_MSG}")
    log(f"Capture target decode CUDA graph end. bs=[1, 2, 4, 8, 16, 24, 32], elapsed={load_seconds * 0.3:.2f} s, "
        f"mem usage=0.00 GB, avail mem={avail - held:.2f} GB.", logger=_scheduler_logger)
    ctx = int(cfg["context_length"] or model_config.get("max_position_embeddings") or 4096)
    log(f"max_total_num_tokens={tokens}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        f"max_running_requests=1024, context_len={ctx}, available_gpu_mem={avail - held:.2f} GB",
        logger=_scheduler_logger)
    return {"tp_rank": cfg["tp_rank"], "pid": os.getpid(), "max_total_num_tokens": tokens,
            "max_req_input_len": ctx - 1}


# sglang 0.5.23 model_executor/runner_backend_utils/__init__.py:14, appended by
# model_executor/runner/decode_cuda_graph_runner.py:603 to the RuntimeError the capture raised
CUDA_GRAPH_CAPTURE_FAILED_MSG = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
    "(Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)


def _graph_oom(gpu: dict, held_mib: int) -> str:
    """torch's OutOfMemoryError text (c10/cuda/CUDACachingAllocator.cpp) for a capture that needs
    more than mem_fraction_static left free: simulated figures from the rank's simulated GPU."""
    total = gpu["memory_total_mib"] / 1024
    free = max(0.0, total - held_mib / 1024) * 0.01
    return (f"CUDA out of memory. Tried to allocate 2.00 GiB. GPU {gpu['index']} has a total capacity of "
            f"{total:.2f} GiB of which {free * 1024:.2f} MiB is free. Including non-PyTorch memory, this process has "
            f"{held_mib / 1024:.2f} GiB memory in use. Of the allocated memory {held_mib / 1024 * 0.97:.2f} GiB is "
            f"allocated by PyTorch, and {held_mib / 1024 * 0.01:.2f} GiB is reserved by PyTorch but unallocated. "
            "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
            "to avoid fragmentation.  See documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


class CheckChildFailed(Exception):
    """The quantization check raised in its child; its traceback, as the rank logs it."""

    def __init__(self, traceback_text: str):
        super().__init__(traceback_text.strip().splitlines()[-1] if traceback_text.strip() else "check failed")
        self.traceback_text = traceback_text


def check_quantization_in_child(model_config: dict, cfg: dict) -> str:
    """check_quantization in a spawned child that exits afterwards: it imports compressed-tensors
    and torch (~350 MB), which the rank would otherwise hold for its whole life. The child logs
    as the rank does; a check that raises fails the rank with the child's traceback. In a sandbox
    guest a passed check of the same config is replayed while every file it imported is unchanged
    (standin_cache); a failed one always runs again."""
    quant_config = model_config.get("quantization_config") or {}
    key = standin_cache.quant_key(quant_config, sglang_src_dir()) if standin_cache.enabled() else None
    record = standin_cache.load(key, [])
    if record is not None:
        if record["source"]:
            log(f"(stand-in) compressed-tensors config checked by {record['source']} code (sglang sources: "
                f"{sglang_src_dir()}): its outcome replayed from an earlier start in this guest with the same "
                "config, compressed-tensors and sglang sources", logger=_scheduler_logger)
        return record["value"]
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    target = importlib.import_module("sglang_standin")._quant_check_child
    child = ctx.Process(target=target, args=(model_config, cfg["log_level"], f" TP{cfg['tp_rank']}", sender,
                                             key is not None),
                        name=f"quant_check_{cfg['tp_rank']}")
    child.start()
    sender.close()
    try:
        status, value, source, imported = receiver.recv()
    except EOFError:
        status, value = "error", f"the quantization check's process died (exit code {child.exitcode})\n"
    child.join()
    if status != "ok":
        raise CheckChildFailed(value)
    standin_cache.store(key, {"value": value, "source": source, "imported": imported}, [])
    return value


def _quant_check_child(model_config: dict, log_level: str, prefix: str, conn, capture: bool = False) -> None:
    _die_with_parent()
    configure_logging(log_level, prefix=prefix)
    announced: list[str] = []

    def announce(source: str) -> None:
        announced.append(source)
        log(f"(stand-in) compressed-tensors config checked by {source} code (sglang sources: "
            f"{sglang_src_dir()})", logger=_scheduler_logger)
    try:
        quant, _ = check_quantization(model_config, announce)
        # what the check ran: every module it imported, and SGLang's two source files it executes
        src = sglang_src_dir()
        upstream = [str(src / rel) for rel in (CT_UTILS_FILE, CT_CONFIG_FILE)] if src else []
        conn.send(("ok", quant, "".join(announced),
                   standin_cache.imported_files(upstream) if capture else {}))
    except Exception:  # noqa: BLE001 - the rank reports it, as SGLang's scheduler would
        conn.send(("error", get_exception_traceback(), "", {}))


def load_draft(draft_path: str, algorithm: str | None) -> tuple[str, int]:
    """The draft model as SGLang's draft worker loads it (--speculative-draft-model-path): its config.json
    (a missing dir or config fails like the target's), then its weights (prepare_weights: "Cannot find any
    model weights"), every safetensors header read. (its architecture, its tensor count)"""
    config = load_model_config(draft_path)
    arch = (config.get("architectures") or ["?"])[0]
    log(f"Load weight begin (draft model, {algorithm}). path={draft_path}", logger=_scheduler_logger)
    files, _source = prepare_weights(draft_path)
    tensors = sum(len(open_safetensors(f)) for f in files if f.endswith(".safetensors"))
    log(f"Load weight end (draft model). type={arch}, ({len(files)} weight file(s), {tensors} tensors)",
        logger=_scheduler_logger)
    return arch, tensors


def check_context_length(context_length, model_config: dict) -> None:
    """sglang 0.5.23 configs/model_config.py _derive_context_length: a --context-length above the
    model's (utils/hf_transformers/common.py get_context_length) stops the start."""
    text = model_config.get("text_config") or model_config
    scaling = text.get("rope_scaling") or {}
    factor = 1 if not scaling or "original_max_position_embeddings" in scaling or \
        scaling.get("rope_type") == "llama3" else scaling.get("factor", 1)
    keys = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")
    derived = next((int(factor * text[key]) for key in keys if text.get(key) is not None), 2048)
    if context_length is None or int(context_length) <= derived:
        return
    msg = (f"Warning: User-specified context_length ({context_length}) is greater than the derived context_length "
           f"({derived}). This may lead to incorrect model outputs or CUDA errors. Note that the derived "
           "context_length may differ from max_position_embeddings in the model's config.")
    if os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "").lower() in ("1", "true"):
        log(msg)
        return
    raise ValueError(f"{msg} To allow overriding this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")


def rank_weight_bytes(files: list[str], model_config: dict, tp: int) -> float:
    """One rank's weight bytes: tensor_plan.place over the shards' headers; the files' bytes / TP
    where the rules are not beside this file (a stand-in run outside a sandbox guest)."""
    shards = [f for f in files if f.endswith(".safetensors")]
    try:
        import tensor_plan  # the sandbox guests' copy
    except ImportError:
        try:
            from core import tensor_plan  # type: ignore[no-redef]  # run from the repository
        except ImportError:
            return sum(os.path.getsize(f) for f in shards) / max(1, tp)
    tensors = tensor_plan.file_tensors(shards)
    return tensor_plan.place(tensor_plan.summarize(tensors), model_config, tp).per_rank_bytes


def kv_cell_bytes(model_config: dict, tp: int, kv_cache_dtype: str | None) -> int:
    """KV bytes per token on one rank, as SGLang's pools size them (mem_cache/memory_pool.py: MLA
    caches kv_lora_rank + qk_rope_head_dim per layer on every rank; MHA K and V of the rank's KV heads)."""
    text = model_config.get("text_config") or model_config
    size = 1 if str(kv_cache_dtype or "").startswith("fp8") else 2  # auto: the model's bf16
    layers = int(text.get("num_hidden_layers") or 1)
    if text.get("kv_lora_rank"):
        return layers * (int(text["kv_lora_rank"]) + int(text.get("qk_rope_head_dim") or 0)) * size
    heads = int(text.get("num_key_value_heads") or text.get("num_attention_heads") or 1)
    head_dim = int(text.get("head_dim") or text.get("hidden_size", 64) // max(1, text.get("num_attention_heads") or 1))
    return layers * 2 * max(1, heads // max(1, tp)) * head_dim * size


def kv_pool_tokens(model_config: dict, cfg: dict, avail_gb: float, weights_gb: float) -> tuple[int, float]:
    """(max_total_num_tokens, KV GB) of one rank: sglang 0.5.23 mem_cache/kv_cache_configurator.py
    _profile_available_bytes: the free memory after the weights minus the free memory before them x
    (1 - mem_fraction_static), over the bytes per token; --max-total-tokens caps it. The fault
    SANDBOX_KV_FRACTION scales it (a pool a fraction of the plan: memory taken by something else)."""
    cell = kv_cell_bytes(model_config, cfg["tp_size"], cfg.get("kv_cache_dtype"))
    rest_gb = (avail_gb - weights_gb) - avail_gb * (1 - cfg["mem_fraction_static"])
    tokens = int(max(rest_gb, 0) * 2**30 // cell)
    tokens = int(tokens * _env_float("SANDBOX_KV_FRACTION", 1.0))
    if cfg.get("max_total_tokens"):
        tokens = min(tokens, int(cfg["max_total_tokens"]))
    return tokens, tokens * cell / 2**30


def rank_configs(args: Args, gpus: list[dict], tp_base: int, load_seconds: float) -> list[dict]:
    """What each of this node's ranks is started with (plain data: pickled to a spawned process).
    The free memory is taken once, before any rank allocates: what SGLang's
    ranks see before the model loads (all-reduced MIN for the balance check)."""
    gpusim = _import_gpusim()
    used = gpusim.used_mib_by_gpu(gpusim.load_layout())
    free = {str(g["index"]): g["memory_total_mib"] - used.get(g["index"], 0) for g in gpus}
    return [
        {"tp_rank": tp_base + i, "local_rank": i, "gpu": g, "free_mib": free, "tp_size": args.tp_size,
         "mem_fraction_static": args.mem_fraction_static, "model_path": args.model_path,
         "context_length": args.context_length, "load_seconds": load_seconds,
         "max_total_tokens": args.fields().get("max_total_tokens"), "kv_cache_dtype": args.fields().get("kv_cache_dtype"),
         "parent_pid": os.getpid(), "log_level": args.log_level,
         "draft_model_path": args.speculative_draft_model_path if args.speculative_algorithm else None,
         "speculative_algorithm": args.speculative_algorithm}
        for i, g in enumerate(gpus)
    ]


class Ranks:
    """This node's rank processes, started with multiprocessing "spawn" like
    SGLang's (engine.py sets it), and the watchdog over them."""

    def __init__(self, cfgs: list[dict]):
        ctx = multiprocessing.get_context("spawn")
        # the module by its own name: picklable whether this runs as __main__ or under runpy
        target = importlib.import_module("sglang_standin").run_rank
        self.procs: list = []
        self.conns: list = []
        self.infos: list[dict] = []  # each rank's "ready" handshake (scheduler.py get_init_info)
        self._stop_watch = threading.Event()
        for i, cfg in enumerate(cfgs):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=target, args=(cfg, child_end), name=f"scheduler_{i}")
            proc.start()
            child_end.close()
            self.procs.append(proc)
            self.conns.append(parent_end)

    def _died(self, i: int) -> RuntimeError:
        """Model of sglang 0.5.23 engine.py _scheduler_died_error."""
        proc = self.procs[i]
        proc.join(timeout=10)
        return RuntimeError(
            f"Rank {i} scheduler died during initialization "
            f"(exit code: {proc.exitcode}). "
            f"If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. "
            f"Run `dmesg -T | grep -i oom` to check."
        )

    def wait_ready(self, stop: threading.Event) -> bool:
        """Model of engine.py _wait_for_scheduler_ready: True once every rank is ready,
        False when stopped first; RuntimeError when a rank died or failed."""
        for i, conn in enumerate(self.conns):
            while True:
                if stop.is_set():
                    return False
                if conn.poll(0.2):
                    try:
                        data = conn.recv()
                    except EOFError:
                        raise self._died(i) from None
                    if data.get("status") != "ready":
                        raise RuntimeError("Initialization failed. Please see the error messages above.")
                    self.infos.append(data)
                    break
                for j, proc in enumerate(self.procs):
                    if not proc.is_alive():
                        raise self._died(j)
        return True

    def start_watchdog(self, interval: float = 1.0) -> None:
        """Model of sglang 0.5.23 srt/utils/watchdog.py SubprocessWatchdog."""

        def loop() -> None:
            while not self._stop_watch.wait(interval):
                for proc in self.procs:
                    if proc.is_alive() or proc.exitcode == 0:
                        continue
                    log(f"Subprocess {proc.name} (pid={proc.pid}) crashed with exit code {proc.exitcode}. "
                        "Triggering SIGQUIT for cleanup...", err=True)
                    os.kill(os.getpid(), signal.SIGQUIT)
                    return

        threading.Thread(target=loop, daemon=True, name="subprocess-watchdog").start()

    def shutdown(self, timeout: float = 10) -> list[int]:
        """Graceful: every rank frees its memory and exits 0 (SGLang's ShutdownReq);
        what is still alive after `timeout` s is killed, and its PIDs returned."""
        self._stop_watch.set()
        for conn in self.conns:
            try:
                conn.send("shutdown")
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        stragglers = [proc.pid for proc in self.procs if proc.is_alive()]
        self.kill()
        return stragglers

    def kill(self) -> None:
        self._stop_watch.set()
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()  # by PID: only the ranks this process started
                proc.join(5)


_common_logger = logging.getLogger("sglang.srt.utils.common")


def _kill_process_tree_self() -> None:
    """Model of sglang 0.5.23 srt/utils/common.py kill_process_tree(os.getpid()):
    the children are SIGKILLed, then the process kills itself."""
    pid = os.getpid()
    _common_logger.info(f"kill_process_tree called: parent_pid={pid}, include_parent=True, pid={pid}")
    for fn in _CLEANUP:
        try:
            fn()
        except Exception:  # noqa: BLE001
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(pid, signal.SIGKILL)


def _sigquit_launch(signum, frame) -> None:
    """engine.py launch_phase_sigquit_handler."""
    log("Received sigquit from a child process. It usually means the child failed.", err=True)
    _kill_process_tree_self()


def _sigquit_running(signum, frame) -> None:
    """http_server.py running_phase_sigquit_handler (once the server is up)."""
    log(f"SIGQUIT received. {signum=}, {frame=}. It usually means one child failed.", err=True)
    _kill_process_tree_self()


# --------------------------------------------------------------------------
# 5. HTTP
# --------------------------------------------------------------------------

_REPLY_WORDS = (
    "This is a simulated answer from the sandbox SGLang stand-in; "
    "no model ran and no GPU was used to write it."
).split()


class ServerState:
    def __init__(self, args: Args, model_config: dict, version: str, full_api: bool = True):
        self.args = args
        self.model_config = model_config
        self.version = version
        self.full_api = full_api
        self.ready = False
        self.scheduler_info: dict = {}  # rank 0's ready handshake: max_total_num_tokens, max_req_input_len
        self.shutting_down = False
        self.inflight = 0
        self.total_requests = 0
        self.spec_totals = [0, 0]  # completion tokens and verify steps of the answers with a draft (/metrics)
        self.cond = threading.Condition()
        self.gen_delay = _env_float("SANDBOX_GEN_DELAY_S", 0.05)
        self.startup_time = time.time()
        self.life: Lifecycle | None = None  # node rank 0: the SIGTERM path (sglang_sigterm.py)

    @property
    def gracefully_exit(self) -> bool:
        return self.life is not None and self.life.gracefully_exit

    def enter(self, rid: str = "") -> None:
        if self.life is not None:
            self.life.auto_create_handle_loop()  # tokenizer_manager.py generate_request
            self.life.enter(rid)
        with self.cond:
            self.inflight += 1
            self.total_requests += 1

    def leave(self, rid: str = "") -> None:
        if self.life is not None:
            self.life.leave(rid)
        with self.cond:
            self.inflight -= 1
            self.cond.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.inflight == 0, timeout)


def _count_tokens(text: str) -> int:
    return max(1, len(text.split()))


# What a correct model answers, SIMULATED for the kinds of prompt a profile's smoke checks ask (no
# model runs here): integer arithmetic, "reply with exactly the word X", a few facts. Anything else
# gets the canned reply. SANDBOX_GIBBERISH=1: a server that is up but broken (a bad kernel, a wrong
# quantization: sglang#8120, #13011) answers every prompt with the same junk while /health is 200.
_EXACT_WORD = re.compile(r"exactly the word\s+[\"']?([A-Za-z0-9_-]+)", re.IGNORECASE)
_ARITHMETIC = re.compile(r"(-?\d+)\s*([-+*x×])\s*(-?\d+)")
_FACTS = {"capital of france": "Paris.", "capital of japan": "Tokyo.", "chemical symbol for gold": "Au.",
          "largest planet": "Jupiter."}
_GIBBERISH = ("!!!!", "ĠĠ", "!!!!", "<0x0A>", "!!!!") * 4


def _answer(prompt: object) -> list[str] | None:
    """A correct model's answer to a smoke check's kind of prompt (SIMULATED), or None."""
    if not isinstance(prompt, str):
        return None
    word = _EXACT_WORD.search(prompt)
    if word:
        return [word.group(1)]
    sum_ = _ARITHMETIC.search(prompt)
    if sum_:
        a, op, b = int(sum_.group(1)), sum_.group(2), int(sum_.group(3))
        return [str(a + b if op == "+" else a - b if op == "-" else a * b)]
    lowered = prompt.lower()
    return next(([fact] for key, fact in _FACTS.items() if key in lowered), None)


def _tool_call(tools: object, prompt: object, parser: str | None) -> list[dict] | None:
    """A correct model's call of the offered tool the prompt names (else the first), SIMULATED, in the
    shape SGLang's parser returns (entrypoints/openai/serving_chat.py _process_tool_calls, :3195-3210;
    the id as _process_tool_call_id, :3129-3148): arguments as a JSON string, each required property
    filled from the prompt (a capitalized word after "in"/"for", a number, else the first word)."""
    offered = [t.get("function") for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []
    offered = [f for f in offered if isinstance(f, dict) and f.get("name")]
    if not offered or not isinstance(prompt, str) or os.environ.get("SANDBOX_GIBBERISH") == "1":
        return None  # gibberish has no tool-call markers: the parser finds no call
    tool = next((f for f in offered if str(f["name"]).lower() in prompt.lower().replace(" ", "_")), offered[0])
    schema = tool.get("parameters") or {}
    place = re.search(r"\b(?:in|for|of)\s+([A-Z][\w-]*)", prompt)
    number = re.search(r"-?\d+", prompt)
    arguments = {}
    for name in schema.get("required", []):
        kind = (schema.get("properties", {}).get(name) or {}).get("type")
        arguments[name] = (int(number.group()) if kind in ("integer", "number") and number
                           else place.group(1) if place else prompt.split()[0])
    call_id = f"functions.{tool['name']}:0" if parser == "kimi_k2" else f"call_{uuid.uuid4().hex[:24]}"
    return [{"id": call_id, "index": 0, "type": "function",
             "function": {"name": tool["name"], "arguments": json.dumps(arguments)}}]


def _reply(max_tokens, prompt: object = None) -> tuple[list[str], str]:
    if os.environ.get("SANDBOX_GIBBERISH") == "1":
        words = list(_GIBBERISH)
    else:
        words = _answer(prompt) or list(_REPLY_WORDS)
    if isinstance(max_tokens, int) and 0 <= max_tokens < len(words):
        return words[:max_tokens], "length"
    return words, "stop"


# The draft's acceptance is SIMULATED (no draft model runs here): SANDBOX_DRAFT_ACCEPT is the accept
# length a /generate answer reports with --speculative-algorithm (tokens per verify step, the bonus
# token included; 1.0: every draft token rejected, the draft gate's fault), at most the draft tokens.
DEFAULT_DRAFT_ACCEPT = 2.6  # a healthy EAGLE3 draft of 3 steps


def _draft_tokens(args: Args) -> int:
    """--speculative-num-draft-tokens as the server reports it (with eagle_topk 1: num_steps + 1)."""
    fields = args.json_fields()
    return int(fields.get("speculative_num_draft_tokens") or (fields.get("speculative_num_steps") or 3) + 1)


def spec_meta_info(args: Args, completion_tokens: int) -> dict:
    """What sglang 0.5.23 adds to a finished request's meta_info with speculative decoding
    (managers/tokenizer_manager.py:2755-2756 and _calculate_spec_decoding_metrics :3149-3172): only
    with verify steps and proposed drafts; the numbers from the simulated accept length."""
    if not args.speculative_algorithm or completion_tokens <= 0:
        return {}
    draft_tokens = _draft_tokens(args)
    accept = min(max(_env_float("SANDBOX_DRAFT_ACCEPT", DEFAULT_DRAFT_ACCEPT), 1.0), float(draft_tokens))
    verify_ct = math.ceil(completion_tokens / accept - 1e-9)  # 26 / 2.6 is 10.000000000000002
    proposed = verify_ct * (draft_tokens - 1)
    if proposed <= 0:
        return {}
    correct = completion_tokens - verify_ct  # each verify step's bonus token is no accepted draft
    return {"spec_accept_rate": correct / proposed, "spec_accept_length": completion_tokens / verify_ct,
            "spec_num_correct_drafts": correct, "spec_num_proposed_drafts": proposed, "spec_verify_ct": verify_ct}


def _chunks(words: list[str]) -> list[str]:
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    timeout = 120  # idle keep-alive connections
    state: ServerState  # set on the subclass

    # quiet default logging; uvicorn-style access lines instead
    def log_message(self, format, *a):  # noqa: A002
        pass

    def _access(self, code: int) -> None:
        path = self.path.split("?", 1)[0]
        if path.startswith(("/health", "/metrics", "/v1/loads", "/ping")):
            return
        host, port = self.client_address[:2]
        try:
            phrase = self.responses[code][0]
        except KeyError:
            phrase = ""
        raw(f'[{time.strftime("%Y-%m-%d %H:%M:%S")}] INFO:     {host}:{port} - '
            f'"{self.command} {self.path} {self.request_version}" {code} {phrase}')

    def _send(self, code: int, body=None, ctype: str = "application/json") -> None:
        if body is None:
            data = b""
        elif isinstance(body, (bytes, bytearray)):
            data = bytes(body)
        elif isinstance(body, str):
            data = body.encode()
        else:
            data = json.dumps(body).encode()
        self.send_response(code)
        if data or ctype == "application/json" and body is not None:
            self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        if self.state.shutting_down:
            self.send_header("connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD" and data:
            self.wfile.write(data)
        self._access(code)

    def _error(self, code: int, message: str, typ: str = "BadRequestError") -> None:
        self._send(code, {"object": "error", "message": message, "type": typ, "param": None, "code": code})

    def _authorized(self, path: str) -> bool:
        key = self.state.args.api_key
        if not key or self.command == "OPTIONS":
            return True
        if path.startswith(("/health", "/ready", "/metrics")):
            return True
        header = self.headers.get("Authorization") or ""
        parts = header.split(" ", 1)
        return len(parts) == 2 and parts[0].lower() == "bearer" and parts[1] == key

    def _json_body(self):
        length = int(self.headers.get("content-length") or 0)
        data = self.rfile.read(length) if length else b""
        if not data:
            return {}
        return json.loads(data)

    # -- dispatch --------------------------------------------------------

    def do_GET(self):  # noqa: N802
        self._dispatch()

    def do_POST(self):  # noqa: N802
        self._dispatch()

    def do_HEAD(self):  # noqa: N802
        self._dispatch()

    def _dispatch(self):
        path = self.path.split("?", 1)[0]
        st = self.state
        try:
            if not st.full_api:  # ranks >= 1: SGLang's dummy health check server
                if path in ("/health", "/health_generate", "/ping") and self.command in ("GET", "HEAD"):
                    return self._send(200)
                return self._send(404, {"detail": "Not Found"})
            if not self._authorized(path):
                return self._send(401, {"error": "Unauthorized"})
            route = ROUTES.get((self.command if self.command != "HEAD" else "GET", path))
            if route is None:
                if any(p == path for (_, p) in ROUTES):
                    return self._send(405, {"detail": "Method Not Allowed"})
                return self._send(404, {"detail": "Not Found"})
            return route(self)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except json.JSONDecodeError as e:
            self._error(400, f"Invalid JSON: {e}")

    # -- endpoints -------------------------------------------------------

    def health(self):
        """http_server.py health_generate (/health, /health_generate)."""
        st = self.state
        if st.gracefully_exit or st.shutting_down:
            log("Health check request received during shutdown. Returning 503.")
            return self._send(503)
        if not st.ready:  # ServerStatus.Starting
            return self._send(503)
        path = self.path.split("?", 1)[0]
        generation = os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "true").strip().lower() in (
            "true", "1")
        if st.life is not None and (generation or path == "/health_generate"):
            st.life.auto_create_handle_loop()  # its one-token request goes through generate_request
        return self._send(200)

    def ready_ep(self):
        """http_server.py ready: tokenizer_manager.is_ready() (not gracefully_exit, Up)."""
        st = self.state
        return self._send(200 if st.ready and not st.gracefully_exit and not st.shutting_down else 503)

    def models(self):
        a = self.state.args
        card = {
            "id": a.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": a.served_model_name,
            "parent": None,
            "max_model_len": self._context_len(),
        }
        return self._send(200, {"object": "list", "data": [card]})

    def _context_len(self) -> int:
        a, cfg = self.state.args, self.state.model_config
        return int(a.context_length or cfg.get("max_position_embeddings") or 4096)

    def server_info(self):
        st = self.state
        info = dict(st.args.json_fields())
        info.update(st.scheduler_info)
        info.update(
            {
                "startup_time": st.startup_time,
                # per DP rank: the resolved server args and the scheduler's topology keys
                # (srt/managers/scheduler_components/internal_state.py, get_internal_state)
                "internal_states": [{**st.args.json_fields(), "world_size": st.args.tp_size,
                                     "startup_time": st.startup_time,
                                     "effective_max_running_requests_per_dp": 1024,
                                     "last_gen_throughput": 0.0}],
                "version": st.version,
                "frontend": "python",
                "simulated": True,
            }
        )
        return self._send(200, info)

    def get_server_info(self):
        log("Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
            "Please use '/server_info' instead.", err=True)
        return self.server_info()

    def model_info(self):
        a, cfg = self.state.args, self.state.model_config
        return self._send(
            200,
            {
                "model_path": a.model_path,
                "served_model_name": a.served_model_name,
                "tokenizer_path": a.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "load_format": "auto",
                "reasoning_parser": a.reasoning_parser,
                "tool_call_parser": a.tool_call_parser,
                "disaggregation_mode": "null",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": cfg.get("model_type"),
                "architectures": cfg.get("architectures"),
            },
        )

    def get_model_info(self):
        log("Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
            "Please use '/model_info' instead.", err=True)
        return self.model_info()

    def v1_loads(self):
        st = self.state
        n = st.inflight
        # sglang 0.5.23's LoadSnapshot core keys (srt/managers/load_snapshot.py, _CORE_KEYS): no
        # num_reqs or num_tokens, and no /get_load route at all (held to the real server's /v1/loads
        # in tests/integration/test_real_server.py)
        load = {"timestamp": time.time(), "dp_rank": 0, "num_running_reqs": n, "num_waiting_reqs": 0,
                "num_waiting_uncached_tokens": 0, "num_used_tokens": n * 64, "num_total_tokens": n * 64,
                "num_active_tokens": n * 64, "num_prealloc_ready_tokens": 0,
                "max_total_num_tokens": int(st.scheduler_info.get("max_total_num_tokens") or 0),
                "max_running_requests": 1024, "token_usage": 0.0, "gen_throughput": 0.0,
                "cache_hit_rate": 0.0, "utilization": 0.0, "total_prefill_uncached_tokens": 0,
                "total_prefill_busy_us": 0}
        return self._send(
            200,
            {
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
                "version": st.version,
                "accelerator": "SIMULATED",
                "num_accelerators": st.args.tp_size,
                "loads": [load],
            },
        )

    def version(self):
        return self._send(200, {"version": self.state.version})

    def metrics(self):
        st = self.state
        if not st.args.enable_metrics:
            return self._send(404, {"detail": "Not Found"})
        name = st.args.served_model_name
        lines = [
            "# HELP sglang:num_running_reqs The number of running requests.",
            "# TYPE sglang:num_running_reqs gauge",
            f'sglang:num_running_reqs{{model_name="{name}"}} {float(st.inflight)}',
            "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.",
            "# TYPE sglang:num_queue_reqs gauge",
            f'sglang:num_queue_reqs{{model_name="{name}"}} 0.0',
            "# HELP sglang:num_requests_total Number of requests.",
            "# TYPE sglang:num_requests_total counter",
            f'sglang:num_requests_total{{model_name="{name}"}} {float(st.total_requests)}',
        ]
        completion, verify_ct = st.spec_totals
        if st.args.speculative_algorithm and verify_ct:
            # sglang 0.5.23 observability/metrics_collector.py:511-516 (the gauge) and :1382-1388 (the
            # scheduler's labels); its value here: the simulated answers' mean, not the last interval's
            labels = f'model_name="{name}",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'
            lines += [
                "# HELP sglang:spec_accept_length Mean acceptance length of speculative decoding (accepted drafts "
                "+ bonus token per forward).",
                "# TYPE sglang:spec_accept_length gauge",
                f"sglang:spec_accept_length{{{labels}}} {completion / verify_ct}",
            ]
        return self._send(200, "\n".join(lines) + "\n", "text/plain; version=0.0.4; charset=utf-8")

    # -- generation ------------------------------------------------------

    def _gen_guard(self) -> bool:
        st = self.state
        if st.shutting_down:
            self._error(503, "The server is shutting down.", "ServiceUnavailableError")
            return False
        if not st.ready:
            # SGLang queues requests until the scheduler is up; the stand-in
            # waits for "ready" the same way (bounded by the load time).
            deadline = time.time() + _env_float("SANDBOX_LOAD_SECONDS", 3.0) + 30
            while not st.ready and time.time() < deadline and not st.shutting_down:
                time.sleep(0.05)
            if not st.ready:
                self._error(503, "The server is not ready.", "ServiceUnavailableError")
                return False
        return True

    def generate(self):
        body = self._json_body()
        if not self._gen_guard():
            return
        st = self.state
        rid = uuid.uuid4().hex
        st.enter(rid)
        try:
            t0 = time.time()
            time.sleep(st.gen_delay)
            text = body.get("text") or ""
            if isinstance(text, list):
                text = " ".join(map(str, text))
            sp = body.get("sampling_params") or {}
            words, finish = _reply(sp.get("max_new_tokens", 128), text)
            out = " ".join(words)
            finish_reason = (
                {"type": "length", "length": len(words)} if finish == "length" else {"type": "stop", "matched": None}
            )
            spec = spec_meta_info(st.args, len(words))
            if spec:
                with st.cond:
                    st.spec_totals[0] += len(words)
                    st.spec_totals[1] += spec["spec_verify_ct"]
            return self._send(
                200,
                {
                    "text": out,
                    "meta_info": {
                        "id": rid,
                        "finish_reason": finish_reason,
                        "prompt_tokens": _count_tokens(str(text)),
                        "completion_tokens": len(words),
                        "cached_tokens": 0,
                        "weight_version": "default",
                        "e2e_latency": round(time.time() - t0, 6),
                        **spec,
                    },
                },
            )
        finally:
            st.leave(rid)

    def _stream_start(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        if self.state.shutting_down:
            self.send_header("connection", "close")
            self.close_connection = True
        self.end_headers()

    def _stream_event(self, payload) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        chunk = f"data: {data}\n\n".encode()
        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        self.wfile.flush()

    def _stream_end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self._access(200)

    def _openai(self, chat: bool):
        body = self._json_body()
        if not self._gen_guard():
            return
        st = self.state
        a = st.args
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return self._error(400, "messages: field required")
            prompt = " ".join(
                m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
                for m in messages
                if isinstance(m, dict)
            )
        else:
            prompt = body.get("prompt")
            if prompt is None:
                return self._error(400, "prompt: field required")
            prompt = prompt if isinstance(prompt, str) else json.dumps(prompt)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        # the user's last message is what a chat model answers (the system prompt is context)
        last_user = next((m.get("content") for m in reversed(body.get("messages") or []) if isinstance(m, dict)
                          and m.get("role") == "user"), None) if chat else prompt
        words, finish = _reply(max_tokens, last_user)
        rid = uuid.uuid4().hex
        created = int(time.time())
        model = body.get("model") or a.served_model_name
        usage = {
            "prompt_tokens": _count_tokens(prompt),
            "completion_tokens": len(words),
            "total_tokens": _count_tokens(prompt) + len(words),
            "prompt_tokens_details": None,
            "reasoning_tokens": 0,
        }
        st.enter(rid)
        try:
            if body.get("stream"):
                obj = "chat.completion.chunk" if chat else "text_completion"
                self._stream_start()
                pieces = _chunks(words)
                delay = st.gen_delay / max(1, len(pieces))
                if chat:
                    self._stream_event(
                        {"id": rid, "object": obj, "created": created, "model": model,
                         "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                      "logprobs": None, "finish_reason": None}]}
                    )
                for piece in pieces:
                    time.sleep(delay)
                    choice = (
                        {"index": 0, "delta": {"content": piece}, "logprobs": None, "finish_reason": None}
                        if chat
                        else {"index": 0, "text": piece, "logprobs": None, "finish_reason": None}
                    )
                    self._stream_event({"id": rid, "object": obj, "created": created, "model": model,
                                        "choices": [choice]})
                last = (
                    {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish, "matched_stop": None}
                    if chat
                    else {"index": 0, "text": "", "logprobs": None, "finish_reason": finish, "matched_stop": None}
                )
                final = {"id": rid, "object": obj, "created": created, "model": model, "choices": [last]}
                if (body.get("stream_options") or {}).get("include_usage"):
                    final["usage"] = usage
                self._stream_event(final)
                self._stream_event("[DONE]")
                self._stream_end()
                return
            time.sleep(st.gen_delay)
            text = "".join(_chunks(words))
            calls = _tool_call(body.get("tools"), last_user, a.tool_call_parser) if chat and a.tool_call_parser \
                else None
            if chat:
                message = {"role": "assistant", "content": "" if calls else text, "reasoning_content": None}
                if calls:  # sglang 0.5.23 drops tool_calls when there are none (protocol.py ChatMessage._serialize)
                    message["tool_calls"] = calls
                choice = {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "tool_calls" if calls and finish == "stop" else finish,
                    "matched_stop": None,
                }
                obj = "chat.completion"
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                          "matched_stop": None}
                obj = "text_completion"
            return self._send(
                200,
                {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
                 "usage": usage, "metadata": {"weight_version": "default"}},
            )
        finally:
            st.leave(rid)

    def chat_completions(self):
        return self._openai(chat=True)

    def completions(self):
        return self._openai(chat=False)


ROUTES = {
    ("GET", "/health"): Handler.health,
    ("GET", "/health_generate"): Handler.health,
    ("GET", "/ready"): Handler.ready_ep,
    ("GET", "/v1/models"): Handler.models,
    ("GET", "/server_info"): Handler.server_info,
    ("GET", "/get_server_info"): Handler.get_server_info,
    ("GET", "/model_info"): Handler.model_info,
    ("GET", "/get_model_info"): Handler.get_model_info,
    ("GET", "/v1/loads"): Handler.v1_loads,
    ("GET", "/version"): Handler.version,
    ("GET", "/metrics"): Handler.metrics,
    ("POST", "/generate"): Handler.generate,
    ("POST", "/v1/chat/completions"): Handler.chat_completions,
    ("POST", "/v1/completions"): Handler.completions,
}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def start_http(host: str, port: int, state: ServerState) -> _Server:
    handler = type("BoundHandler", (Handler,), {"state": state})
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    _Server.address_family = family
    try:
        server = _Server((host, port), handler)
    except OSError as e:
        raw(f"ERROR:    [Errno {e.errno}] error while attempting to bind on address "
            f"({host!r}, {port}): {e.strerror.lower() if e.strerror else e}", err=True)
        raise RuntimeError(f"Port is already in use. host={host!r} port={port}") from e
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                              name="http", daemon=True)
    thread.start()
    return server


# --------------------------------------------------------------------------
# 6. multi-node rendezvous
# --------------------------------------------------------------------------


def _split_addr(addr: str) -> tuple[str, int]:
    if not addr or ":" not in addr:
        raise ValueError(f"--dist-init-addr must be host:port, got {addr!r}")
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


class Rendezvous:
    """Rank 0 listens at --dist-init-addr; ranks 1..N-1 connect and say
    `hello K`. Rank 0 answers `start` to all once every rank joined, and
    `shutdown` when it stops gracefully. A connection that drops ends the
    group: rank 0 exits 1 ("rank K disconnected"), the others exit 1 when
    rank 0 goes away."""

    def __init__(self, args: Args, stop: threading.Event):
        self.args = args
        self.stop = stop
        self.host, self.port = _split_addr(args.dist_init_addr)
        self.conns: dict[int, socket.socket] = {}
        self.lock = threading.Lock()
        self.closing = False
        self.sock: socket.socket | None = None
        self.shutdown_received = threading.Event()
        # node rank -> its ranks' smallest KV pool, once they all loaded (rank 0's view)
        self.loaded: dict[int, int] = {}
        self.all_loaded = threading.Event()

    # rank 0 --------------------------------------------------------------

    def serve(self, timeout: float) -> None:
        n = self.args.nnodes
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        srv = socket.socket(family, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind((self.host, self.port))
        except OSError as e:
            srv.close()
            raise RuntimeError(
                f"Port is already in use. dist_init_addr={self.args.dist_init_addr!r} ({e})"
            ) from e
        srv.listen(n + 4)
        srv.settimeout(0.2)
        log(f"Waiting for {n - 1} other node(s) at {self.args.dist_init_addr} (nnodes={n})")
        deadline = time.time() + timeout
        try:
            while len(self.conns) < n - 1:
                if self.stop.is_set():
                    return
                if time.time() > deadline:
                    missing = sorted(set(range(1, n)) - set(self.conns))
                    raise RuntimeError(
                        f"Timed out after {timeout:.0f} s waiting for node ranks {missing} "
                        f"to join at {self.args.dist_init_addr}"
                    )
                try:
                    conn, peer = srv.accept()
                except TimeoutError:
                    continue
                conn.settimeout(10)
                try:
                    line = _readline(conn)
                except OSError:
                    conn.close()
                    continue
                parts = line.split()
                if len(parts) < 2 or parts[0] != "hello" or not parts[1].isdigit():
                    conn.close()
                    continue
                rank = int(parts[1])
                if not 1 <= rank < n or rank in self.conns:
                    why = "already joined" if rank in self.conns else f"not in 1..{n - 1}"
                    log(f"Rejected a connection from {peer[0]} claiming rank {rank}: {why}", err=True)
                    _send_line(conn, f"reject rank {rank} {why}")
                    conn.close()
                    continue
                conn.settimeout(None)
                self.conns[rank] = conn
                log(f"Node rank {rank} joined from {peer[0]} ({len(self.conns) + 1}/{n} nodes)")
        finally:
            srv.close()
        for rank, conn in sorted(self.conns.items()):
            _send_line(conn, "start")
            threading.Thread(target=self._watch_rank, args=(rank, conn), daemon=True,
                             name=f"rank{rank}").start()
        log(f"All {n} nodes joined.")

    def _watch_rank(self, rank: int, conn: socket.socket) -> None:
        buf = b""
        try:
            while data := conn.recv(4096):
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    parts = line.decode(errors="replace").split()
                    if len(parts) == 2 and parts[0] == "loaded" and parts[1].isdigit():
                        with self.lock:
                            self.loaded[rank] = int(parts[1])
                            if len(self.loaded) == self.args.nnodes - 1:
                                self.all_loaded.set()
        except OSError:
            pass
        with self.lock:
            if self.closing:
                return
        log(f"rank {rank} disconnected", err=True)
        raw(f"RuntimeError: rank {rank} disconnected", err=True)
        _hard_exit(1)

    def wait_loaded(self) -> int | None:
        """Rank 0: wait until every other node's ranks loaded the model; their smallest KV pool, or None
        when the server stops first. A node that fails while loading drops its connection and ends the
        group (_watch_rank). sglang 0.5.23's ranks meet in collectives after the load: the TP group's
        barrier (model_executor/model_runner_components/load_model_utils.py dist_barrier_after_load),
        then the KV pool's free memory as the minimum over the launch world
        (mem_cache/kv_cache_configurator.py: get_available_gpu_memory(distributed=...), utils/common.py),
        so rank 0 cannot serve before the last node's ranks are up, and its pool is the smallest."""
        while not self.all_loaded.wait(0.2):
            if self.stop.is_set():
                return None
        with self.lock:
            return min(self.loaded.values())

    def report_loaded(self, kv_tokens: int) -> None:
        """Ranks >= 1: this node's ranks are up, their smallest KV pool (the MIN all-reduce's share)."""
        if self.sock is not None:
            _send_line(self.sock, f"loaded {kv_tokens}")

    def broadcast_shutdown(self) -> None:
        with self.lock:
            self.closing = True
        for conn in self.conns.values():
            try:
                _send_line(conn, "shutdown")
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    # ranks >= 1 ----------------------------------------------------------

    def join(self, timeout: float) -> None:
        rank = self.args.node_rank
        deadline = time.time() + timeout
        last_err = None
        log(f"Connecting to node rank 0 at {self.args.dist_init_addr} as node rank {rank}")
        while True:
            if self.stop.is_set():
                return
            try:
                sock = socket.create_connection((self.host, self.port), timeout=5)
                break
            except OSError as e:
                last_err = e
                if time.time() > deadline:
                    raise RuntimeError(
                        f"Timed out after {timeout:.0f} s connecting to node rank 0 at "
                        f"{self.args.dist_init_addr}: {last_err}"
                    ) from e
                time.sleep(0.5)
        _send_line(sock, f"hello {rank}")
        sock.settimeout(None)
        self.sock = sock
        line = _readline(sock)
        if line != "start":
            if line.startswith("reject"):
                raise RuntimeError(f"Node rank 0 rejected this node: {line}")
            raise RuntimeError(f"Node rank 0 at {self.args.dist_init_addr} went away before all nodes joined")
        log(f"All {self.args.nnodes} nodes joined.")
        threading.Thread(target=self._watch_rank0, daemon=True, name="rank0").start()

    def _watch_rank0(self) -> None:
        buf = b""
        try:
            while True:
                data = self.sock.recv(4096)
                if not data:
                    break
                buf += data
                if b"shutdown" in buf:
                    self.shutdown_received.set()
                    log("Shutdown request received from node rank 0.")
                    self.stop.set()
                    return
        except OSError:
            pass
        log(f"Node rank 0 at {self.args.dist_init_addr} went away: connection lost. Exiting.", err=True)
        raw(f"RuntimeError: connection to node rank 0 ({self.args.dist_init_addr}) lost", err=True)
        _hard_exit(1)


def _send_line(sock: socket.socket, line: str) -> None:
    sock.sendall((line + "\n").encode())


def _readline(sock: socket.socket, limit: int = 1024) -> str:
    buf = b""
    while not buf.endswith(b"\n") and len(buf) < limit:
        chunk = sock.recv(1)
        if not chunk:
            break
        buf += chunk
    return buf.decode(errors="replace").strip()


_CLEANUP: list = []


def _hard_exit(code: int) -> None:
    for fn in _CLEANUP:
        try:
            fn()
        except Exception:  # noqa: BLE001
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)




# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------


def _sglang_version() -> str:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:  # noqa: BLE001
        return FALLBACK_VERSION


def _wait(stop: threading.Event, seconds: float) -> bool:
    """Sleep unless stopped; True when stopped."""
    return stop.wait(max(0.0, seconds))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    stop = threading.Event()
    # SIGTERM while loading: the default action, as engine.py installs no handler (sglang_sigterm.py, phase A)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    configure_logging()  # SGLang's format until the arguments say more
    log(SIMULATION_BANNER)
    args = parse_args(argv)  # SGLang's parser configures the logging too (in its child)
    if args.parser_kind != "sglang":
        configure_logging(args.log_level)
    if args.parser_kind != "sglang":
        why = (
            "SANDBOX_SGLANG_PARSER=fallback"
            if os.environ.get("SANDBOX_SGLANG_PARSER", "").strip().lower() == "fallback"
            else "sglang is not importable in this python"
        )
        log(f"{why}: arguments parsed by the stand-in's fallback parser, not SGLang's real one "
            "(the real parser was not available)")
    # engine.py, at every start: the resolved arguments, API key in clear (see Args.for_logging)
    _engine_logger.info(f"server_args={args.logged_text()}")
    signal.signal(signal.SIGQUIT, _sigquit_launch)

    load_seconds = _env_float("SANDBOX_LOAD_SECONDS", 3.0)
    nnodes = max(1, args.nnodes)
    if nnodes > 1 and not args.dist_init_addr:
        raise ValueError("--dist-init-addr is required when --nnodes > 1")
    tp_base = args.node_rank * max(1, args.tp_size // nnodes)
    model_config = load_model_config(args.model_path)
    check_context_length(args.context_length, model_config)
    gpusim = _import_gpusim()
    gpus = select_gpus(gpusim.load_layout(), args)
    try:
        return _run(args, stop, model_config, gpus, tp_base, load_seconds)
    finally:
        for fn in _CLEANUP:
            try:
                fn()
            except Exception:  # noqa: BLE001
                pass


def _run(args, stop, model_config, gpus, tp_base, load_seconds) -> int:
    nnodes = max(1, args.nnodes)
    node_rank = args.node_rank
    version = _sglang_version()
    state = ServerState(args, model_config, version, full_api=(node_rank == 0))
    if node_rank == 0:
        state.life = Lifecycle(stop)
    server = None

    # multi-node rendezvous
    rdv = None
    if nnodes > 1:
        rdv = Rendezvous(args, stop)
        if node_rank == 0:
            wait = float(args.dist_timeout) if args.dist_timeout else _env_float("SANDBOX_DIST_WAIT_S", 600.0)
            rdv.serve(wait)
        else:
            rdv.join(float(args.dist_timeout) if args.dist_timeout else 60.0)
    if stop.is_set():
        return _shutdown(state, server, rdv, node_rank)

    # one process per TP rank of this node: each loads, checks and holds its GPU
    ranks = Ranks(rank_configs(args, gpus, tp_base, load_seconds))
    _CLEANUP.append(ranks.kill)
    if not ranks.wait_ready(stop):
        return _shutdown(state, server, rdv, node_rank, ranks)
    # engine.py keeps rank 0's handshake as scheduler_info; /server_info merges it (build_server_info)
    kv_tokens = min(i["max_total_num_tokens"] for i in ranks.infos)
    if rdv is not None and node_rank != 0:
        rdv.report_loaded(kv_tokens)
    elif rdv is not None:  # every node's ranks, as SGLang's collectives after the load make them wait
        others = rdv.wait_loaded()
        if others is None:
            return _shutdown(state, server, rdv, node_rank, ranks)
        kv_tokens = min(kv_tokens, others)
    state.scheduler_info = {"max_total_num_tokens": kv_tokens,
                            "max_req_input_len": ranks.infos[0].get("max_req_input_len", 0)}
    ranks.start_watchdog()
    signal.signal(signal.SIGQUIT, _sigquit_running)
    log(f"Engine startup timings (s): load_weight={load_seconds * 0.6:.2f}, kv_cache_allocation=0.01, "
        f"scheduler_e2e={load_seconds * 0.9:.2f}, cuda_graph={{prefill=0.00, decode={load_seconds * 0.3:.2f}}}")
    # like sglang 0.5.23, nothing answers HTTP while the ranks load (http_server.py starts uvicorn
    # after the engine is up: the real server's journal shows it); then /health 503 until the warmup's done
    if node_rank == 0:
        server = start_http(args.host, args.port, state)
        raw(f"INFO:     Started server process [{os.getpid()}]", err=True)
        raw("INFO:     Waiting for application startup.", err=True)
        raw("INFO:     Application startup complete.", err=True)
        raw(f"INFO:     Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)", err=True)

    if node_rank != 0:
        return _serve_nonzero_node(args, state, rdv, ranks)

    # node rank 0: uvicorn serves (its SIGTERM handler), the warmup request, then ready
    life = state.life
    life.uvicorn_started()
    if _wait(stop, load_seconds * 0.1):
        if life.captured != signal.SIGTERM:
            return _shutdown(state, server, rdv, node_rank, ranks)
        return _stop_before_warmup(state, server)
    if not args.skip_server_warmup:
        life.auto_create_handle_loop()  # the warmup's /generate: SGLang's SIGTERM handler from here on
        log("Prefill batch, #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, "
            "#running-req: 0, #queue-req: 0", logger=_scheduler_logger)
        raw(f'[{time.strftime("%Y-%m-%d %H:%M:%S")}] INFO:     127.0.0.1:0 - "POST /generate HTTP/1.1" 200 OK')
    state.ready = True
    log(READY_LINE)

    stop.wait()
    if not life.drained.is_set():
        if life.captured != signal.SIGTERM:  # SIGINT
            return _shutdown(state, server, rdv, node_rank, ranks)
        # --skip-server-warmup and no generation request yet: uvicorn's handler; its
        # lifespan ends at once (no warmup thread), then capture_signals re-raises
        # SIGTERM under the default action; the ranks follow (PDEATHSIG)
        _uvicorn_exit(state, server)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)
    # sigterm_watchdog drained: ShutdownReq, the schedulers' exit, then the stop hook (uvicorn exits)
    life.stop_schedulers(ranks, rdv.broadcast_shutdown if rdv is not None else None)
    _uvicorn_exit(state, server)
    return 0


def _uvicorn_exit(state: ServerState, server) -> None:
    """uvicorn/server.py Server.shutdown: stop listening, let the open requests finish,
    then the lifespan shutdown (the warmup thread has ended)."""
    state.shutting_down = True
    Lifecycle.uvicorn_shutdown_begin()
    if server is not None:
        server.shutdown()
    state.wait_idle(timeout=None)
    if server is not None:
        server.server_close()
    Lifecycle.uvicorn_shutdown_end()


def _stop_before_warmup(state: ServerState, server) -> int:
    """SIGTERM met uvicorn's handler (sglang_sigterm.py phase B): uvicorn stops
    listening, its lifespan shutdown waits for the warmup thread, which polls the
    closed port, gives up and kills the tree and itself (SIGKILL)."""
    state.shutting_down = True
    Lifecycle.uvicorn_shutdown_begin()
    if server is not None:
        server.shutdown()
        server.server_close()
    a = state.args
    Lifecycle.warmup_gives_up(f"http://{a.host}:{a.port}", _kill_process_tree_self)
    return 1  # not reached: the tree is killed


def _serve_nonzero_node(args, state: ServerState, rdv, ranks: Ranks) -> int:
    """SGLang 0.5.23: node ranks >= 1 run a dummy health check server on host:port
    and stop when node rank 0 broadcasts its shutdown."""
    node_rank = args.node_rank
    server = start_http(args.host, args.port, state)
    state.ready = True
    log(f"Node rank {node_rank} is up; serving only the health check on "
        f"http://{args.host}:{args.port} (ranks >= 1 run no tokenizer or API server)")
    signal.signal(signal.SIGTERM, lambda *_: _nonzero_sigterm(node_rank))
    while not rdv.shutdown_received.is_set():
        if rdv.shutdown_received.wait(0.5):
            break
        if _NONZERO_DEADLINE[0] is not None and time.time() > _NONZERO_DEADLINE[0]:
            log("SANDBOX_NONZERO_SIGTERM_WAIT_S passed without a shutdown from node rank 0; exiting.")
            break
    server.shutdown()
    server.server_close()
    ranks.shutdown()
    log("Exiting.")
    return 0


_NONZERO_DEADLINE: list = [None]


def _nonzero_sigterm(node_rank: int) -> None:
    log(f"SIGTERM received on node_rank {node_rank}; waiting for the rank-0 ShutdownReq "
        "broadcast to stop the schedulers.", err=True)
    wait = os.environ.get("SANDBOX_NONZERO_SIGTERM_WAIT_S", "").strip()
    if wait:
        try:
            _NONZERO_DEADLINE[0] = time.time() + float(wait)
        except ValueError:
            pass


def _shutdown(state: ServerState, server, rdv, node_rank: int, ranks: Ranks | None = None) -> int:
    """SIGINT (uvicorn's handler, also after the warmup: the tokenizer manager takes
    only SIGTERM): health says 503, no new connections, in-flight requests finish;
    then the ranks stop."""
    state.shutting_down = True
    log("(stand-in) SIGINT: gracefully shutting down; waiting for in-flight requests "
        f"({state.inflight}) to finish.")
    if server is not None:
        server.shutdown()  # stop accepting
    state.wait_idle(timeout=None)
    if server is not None:
        server.server_close()
    if rdv is not None and node_rank == 0:
        rdv.broadcast_shutdown()
    if ranks is not None:
        ranks.shutdown()
    log("Graceful shutdown complete. Exiting.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
