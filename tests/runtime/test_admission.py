"""The target a command admits a run for (primus/plan/target.py), admission (primus/runtime/admission.py) and the table of what each target
supports (primus/runtime/capabilities.py)."""
from __future__ import annotations

import pytest

from primus.compat.rules import Translation
from primus.config.errors import ConfigError
from primus.runtime import admission, capabilities
from primus.plan import target as target_module
from primus.plan.target import Target, named_target, target_for
from primus.runtime.admission import Admission, Refusal

CPU = Target("cpu")


def test_a_named_device_that_is_not_here_is_assumed_to_carry_its_training_image():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(target_module, "host_target", lambda: CPU)
        for name, kind, software in (("mi355x", "rocm", "ROCm"), ("MI300X", "rocm", "ROCm"), ("h100", "cuda", "CUDA"),
                                     ("AMD Instinct MI325X", "rocm", "ROCm")):
            target = target_for(name)
            assert (target.accelerator, target.assumed, target.transformer_engine, target.bf16) == \
                (kind, True, True, True)
            assert target.torch_device == "cuda" and target.to_dict()["transformer_engine"] == "assumed"
            assert target.assumption() == (f"not on this host: assumed to have its standard software, torch for "
                                           f"{software} with Transformer Engine, as in the {software} training images")
        assert target_for("AMD Instinct MI325X").name == "mi325x"


def test_the_named_device_of_this_host_is_this_host_with_what_it_has():
    here = Target("rocm", (9, 4), "mi300x")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(target_module, "host_target", lambda: here)
        assert target_for("mi300x") is here
        assert target_for(None) is here
        assert target_for("mi355x").assumed is True


def test_an_unknown_device_is_one_line_with_a_did_you_mean():
    with pytest.raises(ConfigError) as exc:
        target_for("mi350x")
    assert str(exc.value).startswith("--device mi350x: unknown device (did you mean")
    assert "known: a100, b200, h100, h200, mi300x, mi325x, mi355x" in str(exc.value)


def test_this_host_is_a_cpu_target_with_the_cpu_bf16_decision(monkeypatch):
    monkeypatch.setattr(target_module, "_gpu_device_files", lambda: False)
    for mode, bf16 in (("force", True), ("off", False)):
        monkeypatch.setenv("PRIMUS_CPU_BF16", mode)
        target = target_module.host_target()
        assert (target.name, target.accelerator, target.bf16, target.assumed, target.torch_device) == \
            ("cpu", "cpu", bf16, False, "cpu")
        assert target.assumption() is None


@pytest.mark.parametrize("needs, cpu, gpu_without_te, named_gpu", [
    (capabilities.ANY, None, None, None),
    (capabilities.GPU, "needs a GPU; target cpu is a CPU", None, None),
    (capabilities.GPU_TE, "needs a GPU with Transformer Engine; target cpu is a CPU",
     "needs Transformer Engine, which is not importable on this h100 host", None),
    (capabilities.NOWHERE, "a feature: not wired", "a feature: not wired", "a feature: not wired"),
])
def test_each_kind_of_row_decides_per_target(monkeypatch, needs, cpu, gpu_without_te, named_gpu):
    monkeypatch.setitem(capabilities.CAPABILITIES, "test.feature", capabilities.Capability(needs, "a feature",
                                                                                             "not wired"))
    targets = (CPU, Target("cuda", (9, 0), "h100"),
               named_target("mi355x"))
    for target, expected in zip(targets, (cpu, gpu_without_te, named_gpu)):
        why = capabilities.refusal("test.feature", target)
        assert (why is None) == (expected is None) and (expected is None or expected in why), (target, why)


class _Plan:
    class module:
        name = "pre_trainer"
        params: dict = {}


class _Adapter:
    def __init__(self, refused=()):
        self.refused = list(refused)

    def admit(self, plan, target):
        return self.refused


def test_amd_features_refused_at_run_are_decided_per_target_when_they_name_a_row(monkeypatch):
    float8 = Translation("model.converters", ["mx"], None, "not wired", "refuse_at_run", "exp.yaml:9",
                         feature="torchtitan.mx")
    mlperf = Translation("stage", "mlperf_pretrain", None, "needs primus_mllog", "refuse_at_run", "exp.yaml:3")
    named = named_target("mi300x")
    result = admission.admit(_Adapter(), _Plan(), named, [float8, mlperf])
    assert [r.key for r in result.refusals] == ["model.converters", "stage"]  # MX is NOWHERE for now
    assert result.refusals[0].line("pre_trainer").startswith("exp.yaml:9: modules.pre_trainer.model.converters: ")
    monkeypatch.setitem(capabilities.CAPABILITIES, "torchtitan.mx",
                        capabilities.Capability(capabilities.GPU, "MX training"))
    assert [r.key for r in admission.admit(_Adapter(), _Plan(), named, [float8, mlperf]).refusals] == ["stage"]
    assert [r.key for r in admission.admit(_Adapter(), _Plan(), CPU, [float8]).refusals] == ["model.converters"]
    assert Translation.from_dict(float8.to_dict()) == float8  # the row travels with config.resolved.yaml


def test_the_backends_refusals_come_after_the_amd_ones_with_their_file_line():
    class Provenance:
        @staticmethod
        def describe(key):
            return "exp.yaml:12" if key == "modules.pre_trainer.fp8" else "the resolved config"

    result = admission.admit(_Adapter([Refusal("fp8", "hybrid", "'hybrid' cannot be honoured on cpu")]), _Plan(),
                             CPU, [], Provenance())
    assert result.error() == "exp.yaml:12: modules.pre_trainer.fp8: 'hybrid' cannot be honoured on cpu"
    assert not result.ok and Admission(CPU, "pre_trainer").ok
