"""The rolling rollout: deploy.py over a fleet in readiness-gated batches.

pyinfra has no batches (``--serial`` is a batch of one, and its host order is
a set), so this drives pyinfra's API the way its CLI does - State, Inventory,
Config, connect_all, load the deploy file, run_ops - once per batch, over the
hosts of that batch only:

1. settings of every targeted host validated (tasks/spec/), then a fleet
   preflight: every server's GPUs, driver, disk and port gathered in
   parallel; every host that cannot take the model is reported, and nothing
   changes anywhere unless all can;
2. router hosts first (one at a time), then the servers in inventory order:
   the canary batch, then batches of ``batch_size``; each batch runs the
   whole pipeline, readiness included (and, behind a router, drain before the
   restart and registration after), so a batch is ready before the next
   starts;
3. a batch with failed hosts stops the rollout once more than ``max_failed``
   hosts failed in all; later hosts are not touched. A host that cannot be
   reached fails with pyinfra's reason (``cannot connect over ssh to ADDRESS:
   ...``) and counts like any other failure; fewer failures than that let the
   rollout go on, and it still exits 1. Inside a batch every
   host runs to the end of its pipeline or its own failure (no host is left
   drained half-way because another one failed);
4. a summary table: host, batch, result, changed, restarted, time to ready,
   error.

``dry=True`` prepares every batch with change detection and prints each
host's plan; nothing is executed. A plan that knows a failure (core/dry_run.py) or
an unreachable host ends the summary with a line per host and failure: exit 1.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from fnmatch import fnmatch
from pathlib import Path

from rollout import profile, router_loss, staging
from rollout.batches import Batch, HostResult, RolloutReport, plan_batches
from rollout.connections import Connections
from rollout.static_facts import StaticFacts

REPO_ROOT = Path(__file__).resolve().parent.parent


def select_hosts(inventory, limit: Iterable[str] | None) -> list:
    """Hosts in inventory order, restricted to --limit patterns (group names or fnmatch patterns)."""
    hosts = list(inventory)
    patterns = list(limit or [])
    if not patterns:
        return hosts
    chosen: set[str] = set()
    for pattern in patterns:
        group = inventory.get_group(pattern, None) if hasattr(inventory, "get_group") else None
        if group:
            chosen.update(h.name for h in group)
        chosen.update(h.name for h in hosts if fnmatch(h.name, pattern))
    return [h for h in hosts if h.name in chosen]


# --------------------------------------------------------------------------- pyinfra


def failure_reason(state, host, failed_op: str | None) -> str:
    """Why ``host`` failed in this run: the reason its step recorded on the
    run state (core/runstate.py), else the last error output of the failed
    operation (pyinfra's OperationMeta)."""
    from core.ops import explaining_line
    from core.runstate import run_state

    recorded = run_state(state).first_failure(host.name)
    if recorded is not None:
        return recorded.cause
    for op_hash in state.get_op_order():
        op_data = state.ops[host].get(op_hash)
        if op_data is not None and op_data.operation_meta.is_complete() and op_data.operation_meta.did_error():
            meta = op_data.operation_meta
            return explaining_line(meta.stderr_lines or meta.stdout_lines)
    return "failed" if failed_op is None else ""


def connect_failure(host, error: str | None) -> str:
    """Why pyinfra could not reach ``host``, in one line.

    >>> class H: name, data = "gpu-a", {"ssh_hostname": "10.0.0.11"}
    >>> connect_failure(H, "Could not connect ([Errno 111] Connection refused)")
    'cannot connect over ssh to 10.0.0.11: Could not connect ([Errno 111] Connection refused)'
    """
    address = host.data.get("ssh_hostname") or host.name
    return f"cannot connect over ssh to {address}: {error or 'no reason given by pyinfra'}"


def connect_errors_recorder(errors: dict[str, str]):
    """A pyinfra state callback handler that keeps each host's connect error in ``errors``."""
    from pyinfra.api.state import BaseStateCallback

    class ConnectErrors(BaseStateCallback):
        @staticmethod
        def host_connect_error(state, host, error) -> None:
            errors[host.name] = str(error.args[0] if getattr(error, "args", None) else error)

    return ConnectErrors()


class Driver:
    """One rollout. ``run()`` returns a RolloutReport; ``print_summary`` shows it."""

    def __init__(
        self,
        inventory_path: str,
        batch_size: int = 1,
        canary: int = 0,
        max_failed: int = 0,
        dry: bool = False,
        diff: bool = False,
        limit: Iterable[str] | None = None,
        data: dict | None = None,
        group_data: Iterable[str] | None = None,
        deploy_file: str = "deploy.py",
        preflight: bool = True,
        echo: Callable[[str], None] | None = None,
        seed: bool = True,
        stage: bool = False,
        stage_parallel: int = 4,
        stage_only: bool = False,
    ):
        self.inventory_path = str(inventory_path)
        self.batch_size = batch_size
        self.canary = canary
        self.max_failed = max_failed
        self.dry = dry
        self.diff = diff
        self.limit = list(limit or [])
        self.data = dict(data or {})
        self.group_data = [str(Path(d).resolve()) for d in group_data or []]
        self.deploy_file = deploy_file
        self.preflight = preflight
        self.echo = echo or (lambda line: print(line, flush=True))
        self.errors: dict[str, list[str]] = {}
        self.seed = seed
        self.stage, self.stage_parallel, self.stage_only = stage, stage_parallel, stage_only  # rollout/staging.py
        self.groups: dict[str, str] = {}
        self.specs: dict = {}  # server name -> its validated Spec (load())
        self.addresses: dict[str, tuple[str, int]] = {}  # host name -> (ssh address, port)
        self.connections = Connections()  # ssh connections kept from one State to the next (close() ends them)
        self.static_facts = StaticFacts()  # the preflight's GPU facts, for the batches

    # -- pyinfra plumbing

    def _state(self, check_for_changes: bool):
        """A fresh State + Config + Inventory, set as pyinfra's context (like its CLI)."""
        from pyinfra.api import Config, State
        from pyinfra.context import ctx_config, ctx_inventory, ctx_state
        from pyinfra_cli.inventory import make_inventory

        from core.ssh import nodelay_on_connect

        state = State(check_for_changes=check_for_changes)
        state.cwd = str(REPO_ROOT)
        nodelay_on_connect(state)  # ssh without Nagle's ~40 ms waits, as config.py does for the CLI
        ctx_state.set(state)
        # FAIL_PERCENT None: every host of a batch runs to its end or its own failure;
        # the driver gates the batches (max_failed)
        config = Config(FAIL_PERCENT=None, DIFF=self.diff)
        ctx_config.set(config)
        inventory = make_inventory(self.inventory_path, cwd=state.cwd, override_data=dict(self.data),
                                   group_data_directories=self.group_data or None)
        ctx_inventory.set(inventory)
        return state, config, inventory

    def _start(self, state, config, inventory, names: list[str]):
        from pyinfra.api.connect import connect_all
        from pyinfra.api.state import StateStage

        config.lock_current_state()
        limit = [inventory.get_host(name) for name in names]
        state.init(inventory, config, initial_limit=limit)
        for host in limit:
            self.static_facts.attach(host)
        why: dict[str, str] = {}
        state.add_callback_handler(connect_errors_recorder(why))
        profile.watch(state)
        state.set_stage(StateStage.Connect)
        from pyinfra.api.exceptions import PyinfraError

        try:
            with profile.phase("connect"):
                self.connections.adopt(inventory, names)  # open connections of the last State, when they answer
                connect_all(state)
        except PyinfraError:  # all hosts failed to connect ("No hosts remaining!"): each one's reason below
            pass
        unreachable = [h for h in limit if h not in state.active_hosts]
        for host in unreachable:
            self.errors.setdefault(host.name, []).append(connect_failure(host, why.get(host.name)))
        return [h for h in limit if h in state.active_hosts]

    def _stop(self, state) -> None:
        from pyinfra.api.connect import disconnect_all

        self.connections.keep(state.inventory, [host.name for host in state.activated_hosts])
        try:
            with profile.phase("disconnect"):
                disconnect_all(state)
        except Exception:  # noqa: BLE001
            pass

    # -- steps

    def load(self):
        """(routers, servers, inventory order) of the targeted hosts, specs validated."""
        from tasks.spec import RouterSpec, SpecError, host_spec

        state, config, inventory = self._state(check_for_changes=True)
        hosts = select_hosts(inventory, self.limit)
        if not hosts:
            raise SystemExit(f"rollout: no host of {self.inventory_path} matches --limit {' '.join(self.limit)}")
        problems = []
        routers: list[str] = []
        servers: list[str] = []
        self.groups = {}
        for host in hosts:
            try:
                spec = host_spec(host)
            except SpecError as err:
                problems.extend(err.lines)
                continue
            if isinstance(spec, RouterSpec):
                routers.append(host.name)
                continue
            servers.append(host.name)
            self.specs[host.name] = spec
            self.addresses[host.name] = (str(host.data.get("ssh_hostname") or host.name),
                                         int(host.data.get("ssh_port") or 22))
            if spec.group_key:
                self.groups[host.name] = spec.group_key
        if problems:
            raise SpecError(problems, header="invalid settings: nothing was changed")
        return routers, servers

    def gather_preflight(self, routers: list[str], servers: list[str],
                         held: dict[str, set[str]] | None = None,
                         missing: dict[str, set[str]] | None = None) -> dict[str, list[str]]:
        """{host: problems} for every targeted host that cannot take the model (or cannot be reached);
        ``held`` / ``missing`` get each server's pinned revisions ("repo@revision") it holds verified / lacks."""
        import gevent
        from pyinfra.context import ctx_host, ctx_inventory, ctx_state

        from core.checks import host_problems, resolved_spec
        from rollout.seeding import revisions_held, venv_missing
        from tasks.spec import RouterSpec, SpecError, host_spec, validate_inventory

        with profile.phase("inventory"):
            state, config, inventory = self._state(check_for_changes=True)
        active = self._start(state, config, inventory, routers + servers)
        problems: dict[str, list[str]] = {name: list(self.errors.pop(name, [])) for name in routers + servers}
        try:
            with ctx_state.use(state), ctx_inventory.use(inventory):
                try:
                    validate_inventory(inventory)
                except SpecError as err:
                    for line in err.lines:
                        problems.setdefault(line.split(":", 1)[0], []).append(line.split(": ", 1)[-1])

                def one(host) -> list[str]:
                    with ctx_state.use(state), ctx_inventory.use(inventory), ctx_host.use(host):
                        try:
                            spec = host_spec(host)
                            if isinstance(spec, RouterSpec):
                                return []
                            spec = resolved_spec(spec)
                        except SpecError as err:
                            return [line.split(": ", 1)[-1] for line in err.lines]
                        found = host_problems(spec)  # the preflight step's own check
                        have = revisions_held(spec)
                        if held is not None and missing is not None:
                            held[host.name] = {key for key, ok in have.items() if ok}
                            missing[host.name] = {key for key, ok in have.items() if not ok} | venv_missing(spec)
                        return found

                greenlets = {host.name: gevent.spawn(one, host) for host in active if host.name in servers}
                with profile.phase("checks"):
                    gevent.joinall(list(greenlets.values()))
                for name, greenlet in greenlets.items():
                    if greenlet.exception is not None:
                        problems[name].append(f"preflight error: {greenlet.exception}")
                    else:
                        problems[name].extend(greenlet.value or [])
        finally:
            self._stop(state)
        return {name: lines for name, lines in problems.items() if lines}

    def run_on(self, name: str, command: str) -> tuple[bool, list[str]]:
        """One shell command on one host of the inventory, outside any batch: (ok, its output lines)."""
        from pyinfra.api import StringCommand

        state, config, inventory = self._state(check_for_changes=False)
        try:
            active = self._start(state, config, inventory, [name])
            if not active:
                return False, self.errors.pop(name, ["cannot connect"])
            ok, output = active[0].run_shell_command(StringCommand(command), print_output=False, print_input=False)
            return ok, [*output.stdout_lines, *output.stderr_lines]
        finally:
            self._stop(state)

    def run_batch(self, batch: Batch, results: dict[str, HostResult], offers: dict | None = None,
                  deploy_file: str | None = None) -> None:
        """Run (or, dry, prepare) the deploy (``deploy_file``, default the driver's) on the hosts of one batch;
        fill their results. ``offers``: the peers its hosts may copy revisions from (core/seeding.py)."""
        from pyinfra.api.exceptions import PyinfraError
        from pyinfra.api.operations import run_ops
        from pyinfra.api.state import StateStage
        from pyinfra_cli.util import load_deploy_file

        from core.dry_run import known_failures
        from core.runstate import run_state
        from core.seeding import offer

        with profile.phase("inventory"):
            state, config, inventory = self._state(check_for_changes=self.dry)
        run = run_state(state)
        offer(state, offers or {})
        try:
            active = self._start(state, config, inventory, batch.hosts)
            if active:
                state.set_stage(StateStage.Prepare)
                with profile.phase("prepare (deploy file)"):
                    load_deploy_file(state, str(REPO_ROOT / (deploy_file or self.deploy_file)))
                config.reset_locked_state()
                if not self.dry:
                    state.set_stage(StateStage.Execute)
                    try:
                        with profile.phase("execute"):
                            run_ops(state)
                    except PyinfraError as err:  # "No hosts remaining!": every host failed
                        for host in active:
                            if run.first_failure(host.name) is None:
                                self.errors.setdefault(host.name, []).append(str(err))
            for name in batch.hosts:
                result = results[name]
                host = inventory.get_host(name)
                connect_errors = self.errors.pop(name, [])
                if host not in active:
                    result.result, result.error = "failed", (connect_errors or ["cannot connect"])[-1]
                    result.known_failures = [result.error]
                    continue
                if self.dry:
                    result.known_failures = known_failures(state).get(name, [])
                    result.result = "would fail" if result.known_failures else "planned"
                    result.error = "; ".join(message.splitlines()[0] for message in result.known_failures)
                    result.changes = self._planned_changes(state, host)
                    result.changed = bool(result.changes)
                    continue
                failed_op = None
                changed = False
                for op_hash in state.get_op_order():
                    op_data = state.ops[host].get(op_hash)
                    if op_data is None:
                        continue
                    meta = op_data.operation_meta
                    if not meta.is_complete():
                        continue
                    if meta.did_error() and failed_op is None:
                        failed_op = ", ".join(state.get_op_meta(op_hash).names)
                    changed = changed or meta.did_change()
                failed = host in state.failed_hosts or failed_op is not None
                result.result = "failed" if failed else "ok"
                result.changed = changed or bool(result.staged_s is not None and result.changed)  # or its stage
                result.restarted = name in run.restarted
                result.ready_s = run.ready_s.get(name)
                if failed:
                    why = failure_reason(state, host, failed_op) or (connect_errors[-1] if connect_errors else "")
                    result.error = f"{failed_op}: {why}" if failed_op and why else (failed_op or why or "failed")
            router_loss.take(state, results, batch.hosts)
        finally:
            self._stop(state)

    @staticmethod
    def _planned_changes(state, host) -> list[str]:
        out = []
        for op_hash in state.get_op_order():
            op_data = state.ops[host].get(op_hash)
            if op_data is not None and op_data.operation_meta.will_change:
                out.append(", ".join(state.get_op_meta(op_hash).names))
        return out

    # -- the rollout

    def close(self) -> None:
        """Close the ssh connections kept between States."""
        self.connections.close()

    def run(self) -> RolloutReport:
        try:
            return self._run()
        finally:
            self.close()

    def _run(self) -> RolloutReport:
        started = time.monotonic()
        with profile.phase("load (inventory, specs)"):
            routers, servers = self.load()
        batches = plan_batches(routers, servers, self.batch_size, self.canary, self.groups)
        results = {name: HostResult(name, batch.label) for batch in batches for name in batch.hosts}
        report = RolloutReport(results=results, batches=batches, exit_code=0, dry=self.dry)
        self.echo(f"rollout: {len(routers)} router host(s), {len(servers)} server(s) in {len(batches)} batch(es): "
                  + "; ".join(f"{b.label}: {', '.join(b.hosts)}" for b in batches))
        seeding = self._seeding()
        if self.preflight:
            t0 = time.monotonic()
            held: dict[str, set[str]] = {}
            missing: dict[str, set[str]] = {}
            with profile.phase("preflight", scope=True):
                problems = self.gather_preflight(routers, servers, held, missing)
            seeding.learn(held, missing)
            report.preflight_s = time.monotonic() - t0
            report.preflight_problems = problems
            if problems:
                for name, lines in problems.items():
                    results[name].result = "preflight failed"
                    results[name].error = "; ".join(lines)
                    results[name].known_failures = [f"preflight: {line}" for line in lines]
                    for line in lines:
                        self.echo(f"rollout: preflight: {name}: {line}")
                self.echo(f"rollout: {len(problems)} host(s) cannot take the deploy: nothing was changed on any host")
                report.exit_code = 2
                report.total_s = time.monotonic() - started
                return report
            self.echo(f"rollout: preflight ok on {len(servers)} server(s) ({report.preflight_s:.1f} s)")
        try:
            if self.stage_only:
                staging.only(self, report, seeding)
            else:
                self._run_batches(batches, report, seeding)
        finally:
            seeding.close()
        report.total_s = time.monotonic() - started
        return report

    def _seeding(self):
        from core.disk import pins
        from core.seeding import venv_key
        from rollout.seeding import PeerSeeding

        def pinned(name: str) -> dict[str, str]:
            """What a server's converge leaves verified: its pinned revisions and its venv."""
            spec = self.specs.get(name)
            if not spec:
                return {}
            return {**{f"{pin.repo}@{pin.revision}": pin.local_dir for pin in pins(spec)},
                    venv_key(spec.env_digest): spec.server_venv}

        return PeerSeeding(self.run_on, lambda name: self.addresses[name], pinned, self.echo,
                           enabled=self.seed and not self.dry)

    def _run_batches(self, batches: list[Batch], report: RolloutReport, seeding) -> None:
        """The batches in order, each ready before the next; stops past --max-failed."""
        results = report.results
        failed_total = 0
        staged = not self.stage or self.dry  # dry: each batch's plan shows its stage as well
        for index, batch in enumerate(batches):
            if not staged and batch.label != "canary" and not batch.label.startswith("router"):
                staged = True  # the canary passed (or there is none): the later servers stage, serving all along
                failed_total += len(staging.stage(self, staging.later_servers(batches, index - 1, self.specs,
                                                                               results), report, seeding))
                if failed_total > self.max_failed:
                    report.stopped_after, report.exit_code = "stage", 1
                    self.echo(f"rollout: stopped after the stage ({failed_total} failed host(s) > --max-failed "
                              f"{self.max_failed}): no batch after it restarted anything")
                    break
            todo = staging.without_failed(batch, results, self.groups).hosts  # a failed stage: not run
            if not todo:
                continue
            self.echo(f"rollout: batch {batch.label}: {', '.join(todo)}"
                      + (" (dry: plan only)" if self.dry else ""))
            t0 = time.monotonic()
            with profile.phase("batch", scope=True):
                self.run_batch(Batch(batch.label, todo), results, seeding.offers([n for n in todo if n in self.specs]))
            report.batch_seconds[batch.label] = time.monotonic() - t0
            seeding.converged([n for n in todo if n in self.specs and results[n].result == "ok"])
            if self.dry:
                for name in todo:
                    changes = results[name].changes
                    self.echo(f"rollout: plan {name}: " + (", ".join(changes) if changes else "no change")
                              + (f"; the real run would fail: {results[name].error}" if results[name].error else ""))
                if any(results[name].known_failures for name in todo):
                    report.exit_code = 1  # the real run would fail here: the summary's last lines say why
                continue
            failed = [name for name in todo if results[name].result == "failed"]
            failed_total += len(failed)
            self.echo(f"rollout: batch {batch.label} done in {report.batch_seconds[batch.label]:.1f} s"
                      + (f", failed: {', '.join(failed)}" if failed else ", ready"))
            if router_loss.stopped(batch, batches, report, self.echo, self.max_failed):  # a fleet-level stop
                break
            if failed_total > self.max_failed:
                report.stopped_after = batch.label
                report.exit_code = 1
                later = [n for b in batches[index + 1 :] for n in b.hosts]
                if later:
                    self.echo(f"rollout: stopped after batch {batch.label} ({failed_total} failed host(s) > "
                              f"--max-failed {self.max_failed}): not touched: {', '.join(later)}")
                break
        if failed_total and report.exit_code == 0:  # tolerated (--max-failed) but failed all the same
            failed = [name for name, result in results.items() if result.result == "failed"]
            self.echo(f"rollout: {failed_total} host(s) failed, within --max-failed {self.max_failed}: "
                      f"the other batches ran; failed: {', '.join(failed)}")
            report.exit_code = 1
