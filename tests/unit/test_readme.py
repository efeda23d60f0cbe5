"""README.md's settings reference is generated from the typed settings (core/settings_table.py) and
cannot drift: the block between its markers is the generated table, every field has a row, and the
"restarts" column is computed from what core/stamps.py decides a restart from."""

from __future__ import annotations

from typing import Any

import pytest

import core.stamps
from core import settings_table as T
from core.render import render, render_router_unit
from core.stamps import package_name, wanted_router_stamp, wanted_stamp
from facts.model_dir import ModelDir, ModelDirState
from facts.venv import VenvPackages
from tasks.spec import HostSettings, RouterSettings, RouterSpec, Spec

REGENERATE = "README.md's settings table is stale: regenerate it with `.venv/bin/python -m core.settings_table --readme`"
FIELDS = set(HostSettings.model_fields) | set(RouterSettings.model_fields)


@pytest.fixture(scope="module")
def table() -> str:
    return T.settings_table()


@pytest.fixture(scope="module")
def wheel():
    with T.pip_wheel_file() as path:
        yield path


def test_the_readme_holds_the_generated_table(table):
    block = T.readme_block(T.README.read_text())
    assert block is not None, f"README.md has no {T.START} ... {T.END} block"
    assert block == table, REGENERATE


def test_every_setting_has_a_row(table):
    lines = table.splitlines()
    assert "| `keep_envs` | `2` | " in table  # positive control: a field known to exist, with its default
    assert not any(line.startswith("| `tp_sise` |") for line in lines)  # negative control
    for name in FIELDS:
        assert any(line.startswith(f"| `{name}` | ") for line in lines), f"{name} has no row: {REGENERATE}"
    for model, header in ((HostSettings, "restarts the server"), (RouterSettings, "restarts the router")):
        start = next(i for i, line in enumerate(lines) if header in line) + 2
        names = [line.split("`")[1] for line in lines[start:start + len(model.model_fields)]]
        assert names == list(model.model_fields), header


def test_every_row_says_what_it_does(table):
    for line in table.splitlines():
        if line.startswith("| `"):
            name, default, what, restarts = (c.strip() for c in line.strip("|").split(" | "))
            assert default and what and restarts, line


def test_the_key_comments_are_read_whole():
    docs = T.documented(T.SERVER_DOCS)
    assert "kernel JIT" in docs["start_stall_s"]  # an indented comment line below the assignment
    assert docs["model"].startswith("name of a profile") and docs["model"].endswith("attention type")  # header
    assert docs["gpu_ids"].startswith("the GPU indexes")
    assert not any("---" in doc or "python environment" in doc for doc in docs.values())  # section lines are not
    routers = T.documented(T.ROUTER_DOCS)
    assert routers["router_policy"] == "round_robin, cache_aware, random, power_of_two"


def test_every_field_has_one_change_that_changes_it(wheel):
    assert set(T.CHANGES) == FIELDS, "CHANGES in core/settings_table.py: one change per settings field"
    for router, model in ((False, HostSettings), (True, RouterSettings)):
        for name in model.model_fields:
            before, after = T.spec_pair(name, router, wheel)
            if type(before) is type(after):
                assert getattr(before, name) != getattr(after, name), (name, router)
            else:
                assert name == "role", name


class _Host:
    """pyinfra's host for core.stamps: a venv's packages and a model dir's revision follow from their paths
    (a new package set is a new venv; a new revision a new dir); a router's venv holds its pinned package."""

    router_package = ""

    def get_fact(self, fact: Any, path: str) -> Any:
        if fact is VenvPackages:
            if self.router_package:
                return {package_name(self.router_package): self.router_package.split("==")[1]}
            return {"sglang": path}
        assert fact is ModelDirState, fact
        return ModelDir(marker={"revision": path}, files={}, partial_bytes=0)


def _stamp(spec: Spec | RouterSpec, host: _Host) -> dict[str, Any]:
    if isinstance(spec, RouterSpec):
        host.router_package = spec.router_package
        return wanted_router_stamp(render_router_unit(spec), spec.router_venv_path, spec.router_package,
                                   spec.auth_header()) | {"unit name": spec.router_unit_name}
    host.router_package = ""
    return wanted_stamp(spec, render(spec)) | {"unit name": spec.unit_name}


def test_the_restarts_column_is_what_the_restart_stamps_compare(monkeypatch, wheel):
    """Per field: the column says a restart exactly when core/stamps.py's wanted stamp changes."""
    host = _Host()
    monkeypatch.setattr(core.stamps, "host", host)
    seen = set()
    for router, model in ((False, HostSettings), (True, RouterSettings)):
        for name in model.model_fields:
            before, after = T.spec_pair(name, router, wheel)
            if type(before) is not type(after):
                continue
            says = T.restarts(name, router, wheel)
            assert (_stamp(before, host) != _stamp(after, host)) == (says != "no"), (name, router, says)
            seen.add((router, says == "no"))
    assert seen == {(False, True), (False, False), (True, True), (True, False)}  # both answers, both tables


def test_known_answers(wheel):
    # positive and negative controls, from what the code is known to do
    assert T.restarts("packages", False, wheel) == "yes: unit file, venv"  # a new venv, named by its digest
    assert T.restarts("extra_env", False, wheel) == "yes: env file"
    assert T.restarts("keep_envs", False, wheel) == "no"
    assert T.restarts("router_package", True, wheel) == "yes: package"
    assert T.restarts("role", False, wheel).startswith("another kind of host")


def test_the_block_is_written_between_the_markers():
    text = f"intro\n{T.START}\nold\n{T.END}\nrest\n"
    new = T.with_block(text, "| a |\n")
    assert new == f"intro\n{T.START}\n| a |\n{T.END}\nrest\n"
    assert T.readme_block(new) == "| a |\n"
    assert T.readme_block("no markers") is None


def test_cells_escape_what_markdown_would_eat():
    assert T.cell("a | b <dir> *.whl `x | <y>`") == "a \\| b &lt;dir&gt; \\*.whl `x \\| <y>`"
