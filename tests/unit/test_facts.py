"""Facts replayed from fixtures (pyinfra-testing): command in, output in, value out.

One folder per fact under tests/fixtures/facts/<module>.<Fact>/ (facts.<module>), one JSON file
per case.
"""

from pathlib import Path

from pyinfra_testing.facts import make_fact_tests

FIXTURES = Path(__file__).parent.parent / "fixtures" / "facts"

for _folder in sorted(FIXTURES.iterdir()):
    _cls = make_fact_tests("facts", _folder.name, _folder)
    globals()[f"TestFact_{_folder.name.replace('.', '_')}"] = _cls

del _cls, _folder
