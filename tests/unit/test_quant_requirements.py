"""What compressed-tensors must be, from the software that loads the model:
SGLang's declared requirement, the CompressionFormat members its code
references, the model's formats; the upgrade target and its conflicts; the
postcondition checked after the install; and the fact scripts run for real
on a package laid out like an installed distribution."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging.version import Version
from pyinfra_testing.util import FakeState

from core.runstate import run_state
from facts import compressed_tensors as ct_facts
from facts.compressed_tensors import CompressedTensors, FormatReferences, Requirer
from sandbox import tinymodel
from tasks import quant_deps as q
from tasks.spec import load_profile

CT_0_8_1 = CompressedTensors("0.8.1", ["dense", "float_quantized", "int_quantized", "marlin_24", "naive_quantized",
                                       "pack_quantized", "sparse_bitmask"])
CT_0_18_0 = CompressedTensors("0.18.0", sorted(CT_0_8_1.members + ["nvfp4_pack_quantized", "sparse_24_bitmask",
                                                                   "mixed_precision", "mxfp4_pack_quantized"]))
UTILS = "sglang/srt/layers/quantization/compressed_tensors/utils.py"
# sglang 0.5.23's references (utils.is_activation_quantization_format and compressed_tensors.py)
SGLANG_REFS = FormatReferences("sglang", "0.5.23", 4719, {
    "dense": ["sglang/srt/layers/quantization/compressed_tensors/compressed_tensors.py"],
    "float_quantized": [UTILS], "int_quantized": [UTILS], "naive_quantized": [UTILS],
    "nvfp4_pack_quantized": [UTILS], "pack_quantized": [UTILS],
    "sparse_24_bitmask": ["sglang/srt/layers/quantization/compressed_tensors/compressed_tensors.py"]})
NO_SGLANG = FormatReferences("sglang", None, 0, {})
SGLANG = {"sglang": Requirer("0.5.23", ["compressed-tensors==0.18.0"])}
VLLM_065 = {"vllm": Requirer("0.6.5", ["compressed-tensors==0.8.1"])}
VLLM_014 = {"vllm": Requirer("0.14.0", ["compressed-tensors==0.13.0"])}


def test_kimi_int4_under_sglang_0_5_23_needs_0_18_0_because_sglang_says_so():
    need = q.assess(["pack_quantized"], CT_0_8_1, SGLANG_REFS, SGLANG)
    assert need.loader == "sglang 0.5.23" and need.minimum == Version("0.10.0")
    assert need.reasons == [
        "sglang 0.5.23 requires compressed-tensors==0.18.0; installed 0.8.1",
        f"sglang 0.5.23 references CompressionFormat.nvfp4_pack_quantized (compressed-tensors >= 0.10.0); "
        f"installed 0.8.1 lacks it ({UTILS})",
        "sglang 0.5.23 references CompressionFormat.sparse_24_bitmask (compressed-tensors >= 0.9.0); "
        "installed 0.8.1 lacks it (sglang/srt/layers/quantization/compressed_tensors/compressed_tensors.py)",
    ]
    plan = q.upgrade_plan(need, SGLANG, [])
    assert (plan.requirement, plan.because, plan.blockers) == (
        "compressed-tensors==0.18.0", "sglang 0.5.23 requires compressed-tensors==0.18.0", [])


def test_the_model_alone_does_not_ask_for_an_upgrade_of_a_release_with_its_format():
    """What the old table-only check saw: pack_quantized is in 0.8.1, so nothing to do."""
    need = q.assess(["pack_quantized"], CT_0_8_1, NO_SGLANG, VLLM_065)
    assert need.reasons == [] and need.loader is None


def test_an_nvfp4_model_without_sglang_needs_its_first_release():
    need = q.assess(["nvfp4_pack_quantized"], CT_0_8_1, NO_SGLANG, {})
    assert need.reasons == ["the model's config.json names CompressionFormat.nvfp4_pack_quantized "
                            "(compressed-tensors >= 0.10.0); installed 0.8.1 lacks it"]
    plan = q.upgrade_plan(need, {}, [])
    assert plan.requirement == "compressed-tensors>=0.10.0"
    assert plan.because == ("the model's config.json names CompressionFormat.nvfp4_pack_quantized "
                            "(compressed-tensors >= 0.10.0)")


def test_satisfied_when_the_installed_release_meets_all_three():
    assert q.assess(["pack_quantized"], CT_0_18_0, SGLANG_REFS, SGLANG).reasons == []
    assert q.assess(["nvfp4_pack_quantized"], CT_0_18_0, SGLANG_REFS, SGLANG).reasons == []


def test_no_compressed_tensors_at_all():
    need = q.assess(["pack_quantized"], CompressedTensors(None, []), SGLANG_REFS, SGLANG)
    assert need.reasons == ["sglang 0.5.23 requires compressed-tensors==0.18.0; installed none",
                            "the model uses pack_quantized and no compressed-tensors is installed"]


def test_a_newer_release_than_sglang_pins_goes_back_to_the_pin():
    need = q.assess(["pack_quantized"], CompressedTensors("0.19.0", CT_0_18_0.members), SGLANG_REFS, SGLANG)
    assert need.reasons == ["sglang 0.5.23 requires compressed-tensors==0.18.0; installed 0.19.0"]
    assert q.upgrade_plan(need, SGLANG, []).requirement == "compressed-tensors==0.18.0"


def test_a_referenced_member_unknown_to_the_table_is_still_needed():
    refs = FormatReferences("sglang", "0.6.0", 10, {"int2_quantized": ["sglang/x.py"], "pack_quantized": ["sglang/x.py"]})
    need = q.assess(["pack_quantized"], CT_0_18_0, refs, {"sglang": Requirer("0.6.0", ["compressed-tensors>=0.18"])})
    assert need.reasons == ["sglang 0.6.0 references CompressionFormat.int2_quantized (not in the table of first "
                            "releases); installed 0.18.0 lacks it (sglang/x.py)"]
    plan = q.upgrade_plan(need, {"sglang": Requirer("0.6.0", ["compressed-tensors>=0.18"])}, [])
    assert plan.requirement is not None
    assert set(plan.requirement.removeprefix("compressed-tensors").split(",")) == {">=0.18", ">=0.4.0"}
    assert plan.because == "sglang 0.6.0 requires compressed-tensors>=0.18"


@pytest.mark.parametrize("pin, allowed, blocked", [
    (VLLM_065, [], ["vllm 0.6.5 requires compressed-tensors==0.8.1"]),
    (VLLM_014, [], ["vllm 0.14.0 requires compressed-tensors==0.13.0"]),  # above the minimum, but not sglang's pin
    (VLLM_065, ["vllm"], []),
])
def test_a_pin_other_than_sglangs_blocks_naming_both(pin, allowed, blocked):
    need = q.assess(["pack_quantized"], CT_0_8_1, SGLANG_REFS, {**SGLANG, **pin})
    plan = q.upgrade_plan(need, {**SGLANG, **pin}, allowed)
    assert plan.blockers == blocked and plan.because == "sglang 0.5.23 requires compressed-tensors==0.18.0"
    assert (plan.requirement is None) == bool(blocked)
    if allowed:
        assert plan.tolerated == ["vllm 0.6.5 requires compressed-tensors==0.8.1"]


def test_without_sglang_a_pin_that_still_admits_the_minimum_narrows_the_target():
    need = q.Need([], Version("0.10.0"), {"nvfp4_pack_quantized": "the model's config.json names"}, None)
    plan = q.upgrade_plan(need, {"other": Requirer("1.0", ["compressed-tensors<0.12,>=0.9"])}, [])
    assert plan.requirement is not None and set(plan.requirement.removeprefix("compressed-tensors").split(",")) == {
        ">=0.10.0", "<0.12", ">=0.9"}
    blocked = q.upgrade_plan(need, {"other": Requirer("1.0", ["compressed-tensors~=0.8.0"])}, [])
    assert blocked.blockers == ["other 1.0 requires compressed-tensors~=0.8.0"]


def test_sglang_pinning_below_what_its_own_code_references_is_refused():
    need = q.assess(["pack_quantized"], CT_0_8_1, SGLANG_REFS, {"sglang": Requirer("9.9", ["compressed-tensors==0.9.0"])})
    plan = q.upgrade_plan(need, {"sglang": Requirer("9.9", ["compressed-tensors==0.9.0"])}, [])
    assert plan.requirement is None
    assert plan.blockers == ["compressed-tensors >= 0.10.0 is needed for nvfp4_pack_quantized"]


def test_the_postcondition_names_what_is_still_missing():
    need = q.assess(["pack_quantized"], CT_0_8_1, SGLANG_REFS, SGLANG)
    assert q.postcondition(CT_0_18_0, "compressed-tensors==0.18.0", need) == []
    lacking = CompressedTensors("0.18.0", [m for m in CT_0_18_0.members if m != "nvfp4_pack_quantized"])
    assert q.postcondition(lacking, "compressed-tensors==0.18.0", need) == [
        "compressed-tensors 0.18.0 lacks CompressionFormat.nvfp4_pack_quantized (sglang 0.5.23 references it)"]
    assert q.postcondition(CompressedTensors("0.17.0", CT_0_18_0.members), "compressed-tensors==0.18.0", need) == [
        "compressed-tensors 0.17.0 does not satisfy compressed-tensors==0.18.0 (the install's target)",
        "compressed-tensors 0.17.0 does not satisfy compressed-tensors==0.18.0 (sglang 0.5.23 requires it)"]
    assert q.postcondition(CompressedTensors(None, []), "compressed-tensors==0.18.0", need) == [
        "compressed-tensors is not installed after pip install compressed-tensors==0.18.0"]


class _Host:
    """Just enough of a pyinfra host for _upgrade: scripted command results and the re-read fact."""

    name = "sgc1"

    def __init__(self, after: CompressedTensors):
        self.after, self.commands, self.logged = after, [], []

    def run_shell_command(self, command, **_kwargs):
        self.commands.append(str(command))
        return True, SimpleNamespace(stdout_lines=["No broken requirements found."])

    def get_fact(self, _fact, **_kwargs):
        return self.after

    def log(self, message, _func=None):
        self.logged.append(message)

    def log_styled(self, message, **_kwargs):
        self.logged.append(message)


@pytest.mark.parametrize("after, ok", [(CT_0_18_0, True), (CompressedTensors("0.18.0", ["pack_quantized"]), False)])
def test_the_step_succeeds_only_when_the_reread_venv_holds_the_postcondition(after, ok):
    need = q.assess(["pack_quantized"], CT_0_8_1, SGLANG_REFS, SGLANG)
    state, host = FakeState(), _Host(after)
    assert q._upgrade(state, host, "/opt/sglang/venv", "compressed-tensors==0.18.0", ["sglang==0.5.23"], [], need,
                      "sglang 0.5.23 requires compressed-tensors==0.18.0") is ok
    held = q.constraints_path("sglang==0.5.23\n")
    assert held.startswith("/var/cache/sglang-converge/hold-constraints-") and held.endswith(".txt")
    assert any(f"install --upgrade -c {held} compressed-tensors==0.18.0" in command for command in host.commands)
    failure = run_state(state).first_failure("sgc1")
    if ok:
        assert failure is None and "quant deps: compressed-tensors is now 0.18.0" in host.logged[-1]
    else:
        assert failure is not None and failure.cause == (
            "quant deps: after pip install compressed-tensors==0.18.0: compressed-tensors 0.18.0 lacks "
            "CompressionFormat.dense (sglang 0.5.23 references it)")
        assert any("lacks CompressionFormat.nvfp4_pack_quantized (sglang 0.5.23 references it)" in line
                   for line in failure.detail)


# --- the fact scripts, run with a python on a package laid out like an installed one ---------------

def _install_fake_sglang(site: Path) -> None:
    pkg = site / "sglang" / "srt" / "layers" / "quantization" / "compressed_tensors"
    pkg.mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("raise ImportError('importing sglang pulls torch: never import it')\n")
    (pkg / "utils.py").write_text(
        "from compressed_tensors import CompressionFormat\n"
        "def is_activation_quantization_format(format):\n"
        "    _ACTIVATION_QUANTIZATION_FORMATS = [\n"
        "        CompressionFormat.naive_quantized.value,\n"
        "        CompressionFormat.nvfp4_pack_quantized.value,\n"
        "        CompressionFormat.pack_quantized.value,\n"
        "    ]\n"
        "    # CompressionFormat.commented_out is only a comment\n"
        "    return format in _ACTIVATION_QUANTIZATION_FORMATS\n")
    info = site / "sglang-0.5.23.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n"
                                   "Requires-Dist: compressed-tensors==0.18.0\n"
                                   "Requires-Dist: compressed-tensors-extra-tool>=1\n"
                                   "Requires-Dist: compressed-tensors>=0.20; extra == \"next\"\n")
    files = ["sglang/__init__.py", "sglang/srt/layers/quantization/compressed_tensors/utils.py",
             "sglang-0.5.23.dist-info/METADATA", "sglang-0.5.23.dist-info/RECORD"]
    (info / "RECORD").write_text("".join(f"{name},,\n" for name in files))


def _run_script(code: str, site: Path, *args: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r})\n" + code,
                           *args], capture_output=True, text=True, check=True)
    return proc.stdout.splitlines()


def test_the_references_fact_reads_sglangs_source_without_importing_it(tmp_path):
    site = tmp_path / "site"
    _install_fake_sglang(site)
    code = ct_facts._REFERENCES_PY.replace(ct_facts.CACHE_DIR, str(tmp_path / "cache"))
    fact = ct_facts.CompressionFormatReferences()
    refs = fact.process(_run_script(code, site, "sglang"))
    assert refs == FormatReferences("sglang", "0.5.23", 2, {name: [UTILS] for name in (
        "naive_quantized", "nvfp4_pack_quantized", "pack_quantized")})
    assert len(list((tmp_path / "cache").iterdir())) == 1  # the next run reads the cache
    assert fact.process(_run_script(code, site, "sglang")) == refs
    assert fact.process(_run_script(code, site, "vllm")) == FormatReferences("vllm", None, 0, {})


def test_the_requirers_fact_reads_requires_dist_with_versions(tmp_path):
    site = tmp_path / "site"
    _install_fake_sglang(site)
    requirers = ct_facts.CompressedTensorsRequirers().process(_run_script(ct_facts._REQUIRERS_PY, site))
    assert requirers["sglang"] == Requirer("0.5.23", ["compressed-tensors==0.18.0"])


# --- the sandbox's models ---------------------------------------------------------------------------

def test_the_sandbox_model_is_kimi_k2_6s_int4_and_an_nvfp4_profile_is_kept(tmp_path):
    int4, nvfp4 = load_profile("sandbox-tiny"), load_profile("sandbox-tiny-nvfp4")
    kimi = load_profile("kimi-k2.6")
    assert (int4.repo, int4.quantization and int4.quantization.format) == ("sandbox/tiny-kimi-int4", "pack-quantized")
    assert kimi.quantization == int4.quantization and kimi.attention == int4.attention == "mla"
    assert nvfp4.quantization is not None and nvfp4.quantization.format == "nvfp4-pack-quantized"
    assert nvfp4.served_model_name != int4.served_model_name and nvfp4.repo != int4.repo
    info = tinymodel.generate(tmp_path / "m", size_mb=4, shards=2, quant_format="pack-quantized")
    quant = info.config["quantization_config"]
    assert q.needed_formats(info.config) == ["pack_quantized"]
    assert quant["format"] == "pack-quantized" and quant["ignore"][0] == "lm_head"
    weights = quant["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["type"], weights["symmetric"], weights["strategy"], weights["group_size"]) == (
        4, "int", True, "group", 32)
    assert quant["config_groups"]["group_0"]["input_activations"] is None  # W4A16
    assert all(info.config[key] > 0 for key in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim"))
    weight_map = json.loads((info.root / "model.safetensors.index.json").read_text())["weight_map"]
    assert any(name.endswith("mlp.experts.0.gate_proj.weight_packed") for name in weight_map)  # INT4 experts
    assert "model.layers.0.self_attn.kv_b_proj.weight" in weight_map  # attention stays BF16
    assert not any("self_attn" in name and "weight_packed" in name for name in weight_map)
    assert q.needed_formats(tinymodel.generate(tmp_path / "n", size_mb=4, shards=2).config) == ["nvfp4_pack_quantized"]
