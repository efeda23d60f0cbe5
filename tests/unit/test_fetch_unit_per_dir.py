"""Several servers on one host: the download unit is per model dir (core/paths.py fetch_unit_name), and the
model step (tasks/model.py _start) attaches to a sibling server's download of the same dir (also when both
start it at the same moment), is done when a sibling's download filled the dir meanwhile, and attaches to a
download an older deploy runs in the host's one legacy unit, with a scripted host."""

from __future__ import annotations

import re
from types import SimpleNamespace

from core.paths import LEGACY_FETCH_UNIT, fetch_unit_name, seed_key_file, token_file
from tasks import model
from tests.unit.test_fetch_model_step import COMPLETE, GONE, REPO, REVISION, RUNNING, UNIT, ScriptedHost, fetch

SYSTEMD_UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.\\-]+\.service$")


def test_one_unit_per_model_dir_readable_unique_and_shell_safe():
    assert fetch_unit_name("/srv/models/kimi-k2.6") == fetch_unit_name("/srv/models/kimi-k2.6/")
    assert fetch_unit_name("/srv/models/kimi-k2.6").startswith("sglang-model-fetch-kimi-k2.6-")
    # the same last name under another parent is another dir: another unit
    assert fetch_unit_name("/srv/models/kimi-k2.6") != fetch_unit_name("/data/models/kimi-k2.6")
    assert fetch_unit_name("/srv/models/kimi-k2.6") != fetch_unit_name("/srv/models/kimi-k2.6-draft")
    for path in ("/srv/models/a b$(x)", "/" + "x" * 300, "/"):
        name = fetch_unit_name(path)
        assert SYSTEMD_UNIT_NAME.match(name) and "\\" not in name and len(name) <= 255, name
    assert fetch_unit_name("/srv/models/tiny") != LEGACY_FETCH_UNIT


def test_a_download_names_its_dirs_unit_and_the_secrets_are_the_servers_own():
    download = model.Download(repo=REPO, revision=REVISION, local_dir="/srv/models/tiny-draft", argv="python f.py",
                              need=1, expected={}, token_file=None)
    assert download.unit == fetch_unit_name("/srv/models/tiny-draft") != UNIT
    assert token_file("sglang-a") != token_file("sglang-b") and token_file("sglang") == "/etc/sglang/sglang.hf-token"
    assert seed_key_file("sglang-a") == "/etc/sglang/sglang-a.seed-key"


def test_a_dir_a_sibling_server_filled_meanwhile_is_done_without_a_start():
    host = ScriptedHost([COMPLETE], before_dir=COMPLETE["dir"])
    ok, failed = fetch(host)
    assert ok is True and failed is None and host.starts() == 0
    assert any("holds sandbox/tiny-step@0123456789ab already (a sibling server's download finished it)" in line
               for line in host.logged)


def test_a_start_refused_because_a_sibling_started_the_unit_attaches_to_it():
    # both servers' runs looked, saw no unit and started it: systemd-run refuses the second one
    host = ScriptedHost([{"show": [RUNNING, GONE], **COMPLETE}], start_refused=True)
    ok, failed = fetch(host)
    assert ok is True and failed is None
    assert f"model: attaching to the download already running ({UNIT}, started by a sibling server)" in host.logged
    assert not any(line.startswith("model: downloading in") for line in host.logged)


class LegacyHost(ScriptedHost):
    """An older deploy's download runs in the host's one unit, into ``legacy_dir``; the dir's own unit is not loaded."""

    def __init__(self, lives, legacy_dir: str, **kwargs):
        super().__init__(lives, **kwargs)
        self.legacy_dir = legacy_dir

    def run_shell_command(self, command, print_output=False, print_input=False):
        text = command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)
        if text.startswith(f"systemctl show {UNIT} "):
            self.commands.append(text)
            return True, SimpleNamespace(stdout_lines=[f"{k}={v}" for k, v in GONE.items()])
        if text.startswith(f"systemctl show {LEGACY_FETCH_UNIT} --property=ActiveState,ExecStart"):
            self.commands.append(text)
            argv = f"/opt/v/bin/python fetch_model.py --repo {REPO} --local-dir {self.legacy_dir} --margin-bytes 0"
            return True, SimpleNamespace(stdout_lines=[
                "ActiveState=active", f"ExecStart={{ path=/opt/v/bin/python ; argv[]={argv} ; ignore_errors=no }}"])
        return super().run_shell_command(command, print_output, print_input)


def test_an_older_deploys_download_into_the_dir_is_attached_to_and_one_into_another_dir_is_not():
    host = LegacyHost([{"show": [RUNNING, GONE], **COMPLETE}], legacy_dir="/srv/models/tiny")
    host.life, host.shows = 0, [RUNNING, GONE]  # the legacy unit's life: running, then gone
    ok, _failed = fetch(host)
    assert ok is True and host.starts() == 0
    assert (f"model: attaching to the download already running ({LEGACY_FETCH_UNIT}, started by an older deploy)"
            in host.logged)
    assert any(c.startswith(f"systemctl show {LEGACY_FETCH_UNIT} --property=LoadState") for c in host.commands)
    other = LegacyHost([{"show": [RUNNING, GONE], **COMPLETE}], legacy_dir="/srv/models/other")
    ok, _failed = fetch(other)
    assert ok is True and other.starts() == 1
    assert any(c.startswith(f"systemd-run --unit={UNIT} ") for c in other.commands)
