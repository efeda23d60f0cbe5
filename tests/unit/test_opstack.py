"""core/opstack.py: a file pyinfra executes is found in inspect's module cache, and pyinfra's
operation order (its call stack's line numbers) is the same with it."""

from __future__ import annotations

import inspect
import sys

from core import opstack

CODE = "import inspect\nframe = inspect.currentframe()\n"


def run_as_file(path) -> object:
    """Execute CODE as pyinfra's exec_file does (compiled with the file's name, not imported)."""
    path.write_text(CODE)
    scope: dict = {"__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), scope)
    return scope["frame"]


def test_an_executed_file_is_no_loaded_modules_file(tmp_path, monkeypatch):
    # the control: without registering it, inspect finds no module for it, and walks sys.modules each time
    frame = run_as_file(tmp_path / "deploy_control.py")
    assert inspect.getmodule(frame) is None
    walked: list = []
    monkeypatch.setattr(sys, "modules", _Watched(sys.modules, walked))
    assert inspect.getmodule(frame) is None
    assert walked


def test_registered_file_resolves_from_the_cache(tmp_path, monkeypatch):
    path = tmp_path / "deploy.py"
    name = opstack.known_to_inspect(str(path))
    try:
        frame = run_as_file(path)
        assert inspect.getmodule(frame) is sys.modules[name]
        # once cached, no walk of sys.modules: a module loaded now would be seen only by a walk
        walked = []
        monkeypatch.setattr(sys, "modules", _Watched(sys.modules, walked))
        assert inspect.getmodule(frame) is sys.modules[name]
        assert not walked
        # the line and source still come from the file itself
        info = inspect.getframeinfo(frame)
        assert (info.filename, info.lineno, info.code_context) == (str(path), 2, ["frame = inspect.currentframe()\n"])
        assert opstack.known_to_inspect(str(path)) == name  # once per file
    finally:
        sys.modules.pop(name, None)


class _Watched(dict):
    """sys.modules, noting each full copy (inspect.getmodule's walk starts with sys.modules.copy())."""

    def __init__(self, modules: dict, walked: list) -> None:
        super().__init__(modules)
        self._walked = walked

    def copy(self):  # noqa: D102
        self._walked.append(1)
        return dict(self)
