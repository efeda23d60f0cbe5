"""Operations replayed from fixtures (pyinfra-testing): facts in, commands out.

One folder per operation under tests/fixtures/ops/<package>.<module>.<operation>/
(e.g. tasks.router.router_ready, core.ops.managed_file).
"""

import json
from pathlib import Path

import pytest
from pyinfra_testing.operations import make_operation_tests

FIXTURES = Path(__file__).parent.parent / "fixtures" / "ops"
FOLDERS = sorted(FIXTURES.iterdir())
GENERATED = []
CASES = [case for folder in FOLDERS for case in sorted(folder.iterdir())]  # what the classes below were made from

for _folder in FOLDERS:
    _package, _operation = _folder.name.split(".", 1)
    _cls = make_operation_tests(_package, _operation, _folder)
    globals()[f"TestOp_{_folder.name.replace('.', '_')}"] = _cls
    GENERATED.append(_cls)

del _cls, _folder

# pyinfra-testing only warns when an operation that does nothing has no noop_description: a failure here
pytestmark = pytest.mark.filterwarnings("error:No noop_description set for test")


def test_every_fixture_is_a_case_that_asserts():
    """pyinfra-testing makes a test per .json/.yaml/.yml file and silently none for an empty
    folder or a misnamed file, and returns early (passing) for a case whose require_platform
    is not this one: every folder holds cases, every case became a test and asserts."""
    assert len(FOLDERS) >= 9, FOLDERS
    cases = CASES
    assert sorted({case.parent for case in cases}) == FOLDERS  # no empty folder
    assert [case for case in cases if case.suffix != ".json"] == []
    for case in cases:
        data = json.loads(case.read_text())
        assert "commands" in data or "exception" in data, case
        assert "require_platform" not in data, case
    tests = [name for cls in GENERATED for name in vars(cls) if name.startswith("test_")]
    assert len(tests) == len(cases)
