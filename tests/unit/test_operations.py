"""Operations replayed from fixtures (pyinfra-testing): facts in, commands out.

One folder per operation under tests/fixtures/ops/<package>.<module>.<operation>/
(e.g. tasks.router.router_ready, core.ops.managed_file).
"""

from pathlib import Path

from pyinfra_testing.operations import make_operation_tests

FIXTURES = Path(__file__).parent.parent / "fixtures" / "ops"

for _folder in sorted(FIXTURES.iterdir()):
    if any(_folder.iterdir()):
        _package, _operation = _folder.name.split(".", 1)
        _cls = make_operation_tests(_package, _operation, _folder)
        globals()[f"TestOp_{_folder.name.replace('.', '_')}"] = _cls

del _cls, _folder
