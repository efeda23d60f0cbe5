"""The scale bench's pure parts: ssh connection counting, pyinfra's results table,
and the clone layers' naming (sandbox/clones.py, sandbox/hosts.py)."""

from __future__ import annotations

import pytest

from bench.scale import changed_operations, grand_total_changed, ssh_connections
from sandbox import clones, hosts

TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 014D4D0A:A1B2 024D4D0A:0016 01 00000000:00000000 00:00000000 00000000     0        0 1001 1
   1: 014D4D0A:A1B3 024D4D0A:0016 06 00000000:00000000 00:00000000 00000000     0        0 1002 1
   2: 014D4D0A:A1B4 024D4D0A:1F90 01 00000000:00000000 00:00000000 00000000     0        0 1003 1
   3: 014E4D0A:A1B5 024E4D0A:0016 01 00000000:00000000 00:00000000 00000000     0        0 1004 1
   4: 0100007F:0016 0100007F:A1B6 01 00000000:00000000 00:00000000 00000000     0        0 1005 1
"""


def test_ssh_connections_counts_established_port_22_of_our_sockets_only():
    # 1001 and 1004: established to :22; 1002 TIME_WAIT; 1003 another port; 1005 local :22; 9999 not ours
    assert ssh_connections(TCP, {"1001", "1002", "1003", "1004", "1005"}) == 2
    assert ssh_connections(TCP, {"1001"}) == 1
    assert ssh_connections(TCP, {"9999"}) == 0
    assert ssh_connections("", {"1001"}) == 0


RESULTS = """
[sgc1] waiting: 5 s, /health 503 (loading), active/running; GPU MiB used: 0 83203 83203 83203
--> Results:
    Operation                        Hosts   Success   Error   No Change
    Service | sglang.service         3       1         -       2
    Readiness | server ready         3       -         -       3
    Grand total                      6       1         -       5
"""


def test_results_table_parsing():
    assert grand_total_changed(RESULTS) == 1
    assert grand_total_changed(RESULTS.replace("6       1", "6       -")) == 0
    assert grand_total_changed("no table") == 0
    assert changed_operations(RESULTS) == ["Service | sglang.service"]


def test_snapshot_layer_sits_between_rootfs_and_the_hosts_upper_dir(tmp_path):
    base = tmp_path / "rootfs"
    assert hosts._lowerdirs(base, None) == str(base)
    layer = clones.snapshot_path("bench-scale")
    assert layer.name == "bench-scale"
    assert hosts._lowerdirs(base, layer) == f"{layer}:{base}"


@pytest.mark.parametrize("label", ["", "../x", "a b", "a:b", "a/b"])
def test_snapshot_labels_are_plain_names(label):
    with pytest.raises(ValueError):
        clones.snapshot_path(label)


def test_a_snapshot_drops_the_templates_boot_state():
    drops = clones.snapshot_drops()
    assert "var/log/journal" in drops
    assert "run/sandbox-gpu" in drops
    assert all(not d.startswith("/") for d in drops)


def test_inotify_limit_grows_with_the_guests_and_is_never_lowered():
    assert hosts.inotify_instances_needed(50, 128) == 50 * hosts.INOTIFY_PER_GUEST + hosts.INOTIFY_SLACK
    assert hosts.inotify_instances_needed(1, 128) == max(128, hosts.INOTIFY_PER_GUEST + hosts.INOTIFY_SLACK)
    assert hosts.inotify_instances_needed(10, 100000) == 100000


def _m(dry: float, noop: float, dry1: float, noop1: float) -> dict:
    return {"dry_s": dry, "noop_s": noop, "dry_1_adjacent_s": dry1, "noop_1_adjacent_s": noop1, "noop_changed": 0,
            "noop_cpu_s": 1.0, "noop_guest_cpu_s": 1.0, "dry_guest_cpu_s": 0.1, "peak_rss_mib": 70.0, "peak_ssh": 1}


def test_figures_give_the_ratios_of_the_largest_n_and_50_to_one_host():
    from bench.scale import figures

    out = {"converge_s": 100.0, "template": {"upper_disk": 2**30, "rss": 2**30, "pss": 2**29}, "layer_disk": 2**30,
           "capped": "", "settles": [], "by_n": {1: _m(2.0, 4.0, 2.0, 4.0), 10: _m(3.0, 8.0, 2.0, 5.0),
                                                  50: _m(4.0, 12.0, 2.0, 6.0)}}
    fig = figures(out)
    assert fig["scale_dry_50_over_1"] == 2.0 and fig["scale_noop_50_over_1"] == 3.0
    assert "scale_noop_10_over_1" not in fig  # only the largest N (and 50)
    assert fig["scale_noop_10_over_adjacent_1"] == 8.0 / 5.0
    assert "scale_noop_1_over_adjacent_1" not in fig
    assert fig["scale_max_hosts"] == 50 and fig["scale_host_upper_disk_mib"] == 1024


def test_forget_drops_one_parts_keys(tmp_path, monkeypatch):
    import json

    from bench import results

    monkeypatch.setattr(results, "RESULTS", tmp_path / "latest.json")
    results.record({"scale_noop_s_17": 1.0, "noop_s": 2.0})
    results.forget("scale_")
    assert json.loads((tmp_path / "latest.json").read_text()) == {"noop_s": 2.0}


def test_cpu_floor_and_per_host_cpu(monkeypatch):
    from bench import scale

    monkeypatch.setattr(scale.os, "cpu_count", lambda: 2)
    one = {**_m(2.0, 4.0, 2.0, 4.0), "noop_cpu_s": 1.0, "noop_guest_cpu_s": 0.5}
    fifty = {**_m(4.0, 20.0, 2.0, 4.0), "noop_cpu_s": 5.9, "noop_guest_cpu_s": 30.0}
    out = {"converge_s": 100.0, "template": {"upper_disk": 2**30, "rss": 2**30, "pss": 2**29}, "layer_disk": 2**30,
           "capped": "", "settles": [], "by_n": {1: one, 50: fifty}}
    fig = scale.figures(out)
    assert fig["scale_noop_cpu_floor_s_50"] == (5.9 + 30.0) / 2
    assert fig["scale_noop_50_over_cpu_floor"] == 20.0 / ((5.9 + 30.0) / 2)
    assert fig["scale_noop_cpu_floor_s_1"] == 0.75
    assert abs(fig["scale_noop_controller_cpu_per_added_host_s"] - 0.1) < 1e-9
    assert fig["scale_noop_guest_cpu_per_host_s"] == 30.0 / 50
