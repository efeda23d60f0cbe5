"""Facts replayed from fixtures (pyinfra-testing): command in, output in, value out.

One folder per fact under tests/fixtures/facts/<module>.<Fact>/ (facts.<module>), one JSON file
per case.
"""

import json
from pathlib import Path

import pytest
from pyinfra_testing.facts import make_fact_tests

FIXTURES = Path(__file__).parent.parent / "fixtures" / "facts"
FOLDERS = sorted(FIXTURES.iterdir())
GENERATED = []
CASES = [case for folder in FOLDERS for case in sorted(folder.iterdir())]  # what the classes below were made from

for _folder in FOLDERS:
    _cls = make_fact_tests("facts", _folder.name, _folder)
    globals()[f"TestFact_{_folder.name.replace('.', '_')}"] = _cls
    GENERATED.append(_cls)

del _cls, _folder

# pyinfra-testing only warns when a case does not say which command (or requires_command) the
# fact must run, and then does not check it: a failure here
pytestmark = pytest.mark.filterwarnings("error:No command set for test", "error:No requires command set for test")


def test_every_fixture_is_a_case_that_asserts():
    """pyinfra-testing makes a test per .json/.yaml/.yml file and silently none for an empty
    folder or a misnamed file: every folder holds cases, every case became a test and names
    the command, its output and the fact's value."""
    assert len(FOLDERS) >= 18, FOLDERS
    cases = CASES
    assert sorted({case.parent for case in cases}) == FOLDERS  # no empty folder
    assert [case for case in cases if case.suffix != ".json"] == []
    for case in cases:
        assert {"command", "output", "fact"} <= set(json.loads(case.read_text())), case
    tests = [name for cls in GENERATED for name in vars(cls) if name.startswith("test_")]
    assert len(tests) == len(cases)
