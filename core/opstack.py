"""The deploy file named as a loaded module's file, so that pyinfra's stack walk stays cheap.

In CLI mode pyinfra orders each operation by the line numbers of its call stack
(pyinfra/api/util.py, ``get_operation_order_from_stack``: ``inspect.stack()``,
then ``getframeinfo`` on every frame again). ``inspect.getmodule`` answers a
frame's file from its cache of loaded modules' files; for a file that is no
loaded module's, it walks all of ``sys.modules`` again, on every call. The
deploy file is such a file: pyinfra ``exec``s it rather than importing it, and
its frame is on the stack of every operation, three lookups each. With ~1,500
modules loaded that was ~40 % of the controller's per-host work on a no-op run
(57 full walks per host for 19 operations).

``known_to_inspect(__file__)`` (deploy.py, rollback.py) puts an empty module
whose ``__file__`` is the deploy file into ``sys.modules``, so inspect's cache
has it after one walk. The frame's source still comes from the file itself
(linecache), so the line numbers, and thus the operation order, are the same.
"""

from __future__ import annotations

import os
import sys
import types

MODULE_PREFIX = "_sglang_converge_deploy_file:"


def known_to_inspect(path: str) -> str:
    """Register ``path`` (a file pyinfra executes) as a module's file; the module's name."""
    absolute = os.path.abspath(path)
    name = MODULE_PREFIX + absolute
    if name not in sys.modules:
        module = types.ModuleType(name, f"stands for {absolute}, which pyinfra executes, for inspect's cache")
        module.__file__ = absolute
        sys.modules[name] = module
    return name
