"""`primus prepare megatron --with-te`: the Transformer Engine build that fits the installed torch (NVIDIA's
PyPI packages for a CUDA torch, AMD's fork built from source for a ROCm torch), printed by --dry-run; a
CPU torch is refused in one line. Nothing is installed here (no GPU toolchain on this host)."""
from __future__ import annotations

import importlib.metadata
import re

import pytest

from primus.prepare import te
from primus.prepare.pip import prepare

ROCM_ENV = {"NVTE_FRAMEWORK": "pytorch", "NVTE_USE_ROCM": "1", "NVTE_USE_HIPBLASLT": "1",
            "NVTE_ROCM_ARCH": "gfx942;gfx950"}


@pytest.mark.parametrize("torch_version, cuda, build, extra", [
    ("2.9.0+cu128", None, "cuda12", "core_cu12"),
    ("2.10.0+cu126", None, "cuda12", "core_cu12"),
    ("2.10.0+cu130", None, "cuda13", "core_cu13"),
    ("2.9.0", "12.8", "cuda12", "core_cu12"),  # PyPI's default Linux wheel: no label, torch.version.cuda says
])
def test_a_cuda_torch_gets_nvidias_pypi_packages(torch_version, cuda, build, extra):
    install = te.te_install(torch_version, cuda=cuda, environ={})
    assert install.build == build and install.env == {}
    assert install.requirement == f"transformer_engine[pytorch,{extra}]==2.11.0"
    assert install.command("python", "c.txt") == [
        "python", "-m", "pip", "install", "--disable-pip-version-check", "-c", "c.txt", "--no-build-isolation",
        f"transformer_engine[pytorch,{extra}]==2.11.0"]


@pytest.mark.parametrize("torch_version, hip", [("2.9.1+rocm6.3", None), ("2.12.0+rocm7.15.0a20260720", None),
                                                ("2.9.0", "6.4.43482")])
def test_a_rocm_torch_gets_amds_fork_built_at_amd_primus_images_commit(torch_version, hip):
    install = te.te_install(torch_version, hip=hip, environ={})
    assert install.build == "rocm"
    assert install.requirement == ("git+https://github.com/ROCm/TransformerEngine.git"
                                   "@e6ede467a49cfda1859b145e045109e2f330bccc")
    assert install.pip_args == ("--no-build-isolation",) and install.env == ROCM_ENV
    assert te.te_install(torch_version, hip=hip, environ={"PYTORCH_ROCM_ARCH": "gfx942"}).env["NVTE_ROCM_ARCH"] == \
        "gfx942"  # the image's own architecture list wins


@pytest.mark.parametrize("torch_version, cuda, message", [
    ("2.13.0+cpu", None, "Transformer Engine needs a CUDA or ROCm torch; the installed torch 2.13.0+cpu is a CPU "
                         "build (FP8 and context parallel run on GPUs only)"),
    ("2.9.0", None, "the installed torch 2.9.0 is a CPU build"),
    ("2.4.0+cu118", None, "Transformer Engine 2.11.0 is built for CUDA 12 and 13; the installed torch 2.4.0+cu118 "
                          "is a CUDA 11 build"),
])
def test_no_transformer_engine_for_a_cpu_torch(torch_version, cuda, message):
    with pytest.raises(te.NoTransformerEngine, match=re.escape(message)):
        te.te_install(torch_version, cuda=cuda, environ={})


def test_the_cuda_pin_is_one_megatron_core_accepts():
    from packaging.requirements import Requirement

    requires = [Requirement(r) for r in importlib.metadata.requires("megatron-core") or []]
    wanted = next(r for r in requires if r.name == "transformer-engine")  # its dev extra's range
    assert te.TE_VERSION in wanted.specifier and "pytorch" in wanted.extras


def _dry_run(monkeypatch, torch, extra="megatron") -> list[str]:
    monkeypatch.setattr(te, "installed_torch", lambda: torch)
    monkeypatch.setattr(te, "installed_te", lambda: None)
    lines: list[str] = []
    assert prepare(extra, dry_run=True, with_te=True, out=lines.append) == 0
    return lines


def test_dry_run_prints_the_cuda_command_under_the_torch_constraint(monkeypatch):
    lines = _dry_run(monkeypatch, ("2.9.0+cu128", "12.8", None))
    assert "Transformer Engine (cuda12 build: transformer_engine[pytorch,core_cu12]==2.11.0)" in lines[0]
    assert re.fullmatch(r"\S+ -m pip install --disable-pip-version-check -c \S+constraints\.txt "
                        r"--no-build-isolation transformer_engine\[pytorch,core_cu12\]==2\.11\.0", lines[-1])


def test_dry_run_prints_the_rocm_build_with_its_environment(monkeypatch):
    monkeypatch.delenv("PYTORCH_ROCM_ARCH", raising=False)
    line = _dry_run(monkeypatch, ("2.9.1+rocm6.3", None, "6.3.42131"))[-1]
    assert line.startswith("NVTE_FRAMEWORK=pytorch NVTE_USE_ROCM=1 NVTE_USE_HIPBLASLT=1 "
                           "'NVTE_ROCM_ARCH=gfx942;gfx950' ")
    assert line.endswith("--no-build-isolation git+https://github.com/ROCm/TransformerEngine.git"
                         "@e6ede467a49cfda1859b145e045109e2f330bccc")


def test_on_a_cpu_torch_it_is_one_line_and_exit_2(capsys):
    from primus.cli.main import main

    import torch

    if torch.version.cuda or torch.version.hip:
        pytest.skip("this torch is a GPU build")
    assert main(["prepare", "megatron", "--with-te", "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"primus: error: prepare megatron --with-te: Transformer Engine needs a CUDA or ROCm "
                                f"torch; the installed torch {torch.__version__} is a CPU build (FP8 and context "
                                "parallel run on GPUs only)"] and not out


def test_with_te_is_the_megatron_extras(capsys):
    assert prepare("torchtitan", dry_run=True, with_te=True) == 2
    assert "Transformer Engine is the Megatron backend's" in capsys.readouterr().err
