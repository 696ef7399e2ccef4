"""Transformer Engine for the Megatron backend (FP8, context parallel): the build that fits the torch
already installed, or a one-line refusal on a CPU torch. Standard library only, like ``pip.py``.

- **CUDA torch** (``2.9.0+cu128``; ``torch.version.cuda`` when the version has no label): NVIDIA's PyPI
  packages, ``transformer_engine[pytorch,core_cu12]`` (``core_cu13`` for CUDA 13) at ``TE_VERSION``, the
  newest release megatron-core 0.16.1 accepts (its ``dev`` extra: ``transformer-engine[core_cu13,pytorch]
  >=2.9.0a0,<2.12.0``). ``transformer_engine_torch`` is a source distribution compiled against the
  installed torch, so pip runs with ``--no-build-isolation`` (NVIDIA's installation instructions); it
  needs the CUDA toolkit (nvcc, cuDNN headers) of the image.
- **ROCm torch** (``2.9.0+rocm6.4``; ``torch.version.hip``): AMD's fork, ROCm/TransformerEngine, built
  from source at the commit AMD Primus's ``Dockerfile.primus-v26.4`` builds (AMD-AGI/Primus fd1eeab
  ``.github/workflows/docker-release/``), with that image's build environment (``NVTE_FRAMEWORK=pytorch``,
  ``NVTE_USE_ROCM=1``, ``NVTE_USE_HIPBLASLT=1``, ``NVTE_ROCM_ARCH`` = ``PYTORCH_ROCM_ARCH`` or
  gfx942;gfx950). (AMD's v26.5 images install a nightly ``transformer_engine_rocm_torch`` wheel built for
  their TheRock ROCm 7.15 nightly torch instead; it fits only that torch.) Needs hipcc and git.
- **CPU torch**: refused; Transformer Engine has no CPU kernels.

Every command runs under the constraint file that freezes the installed torch family (``pip.py``).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

TE_VERSION = "2.11.0"
ROCM_TE_REPO = "https://github.com/ROCm/TransformerEngine.git"
ROCM_TE_COMMIT = "e6ede467a49cfda1859b145e045109e2f330bccc"  # AMD Primus Dockerfile.primus-v26.4, TE_BRANCH
ROCM_ARCH = "gfx942;gfx950"  # that image's PYTORCH_ROCM_ARCH: MI300X/MI325X, MI355X


class NoTransformerEngine(ValueError):
    """This torch cannot take Transformer Engine (a CPU build)."""


@dataclass(frozen=True)
class TEInstall:
    build: str  # cuda12 | cuda13 | rocm
    requirement: str  # what pip installs
    pip_args: tuple[str, ...]  # before the requirement
    env: dict[str, str] = field(default_factory=dict)

    def command(self, python: str, constraint: str, quiet: bool = False) -> list[str]:
        return [python, "-m", "pip", "install", "--disable-pip-version-check", *(["-qq"] if quiet else []),
                "-c", constraint, *self.pip_args, self.requirement]

    def done(self) -> bool:
        """Already installed: the pinned release (CUDA), or any build of AMD's fork (ROCm)."""
        have = installed_te()
        return have is not None and (self.build == "rocm" or have.split("+")[0] == TE_VERSION)


def te_install(torch_version: str, cuda: str | None = None, hip: str | None = None,
               environ: dict[str, str] | None = None) -> TEInstall:
    """The Transformer Engine build for ``torch_version`` (its ``+cuXYZ`` / ``+rocmX`` label, else
    ``torch.version.cuda`` / ``torch.version.hip``); NoTransformerEngine for a CPU torch."""
    environ = os.environ if environ is None else environ
    label = torch_version.partition("+")[2]
    rocm = label.startswith("rocm") or (not label and hip)
    cuda_major = _cuda_major(label, cuda)
    if rocm:
        env = {"NVTE_FRAMEWORK": "pytorch", "NVTE_USE_ROCM": "1", "NVTE_USE_HIPBLASLT": "1",
               "NVTE_ROCM_ARCH": environ.get("PYTORCH_ROCM_ARCH") or ROCM_ARCH}
        return TEInstall("rocm", f"git+{ROCM_TE_REPO}@{ROCM_TE_COMMIT}", ("--no-build-isolation",), env)
    if cuda_major in (12, 13):
        return TEInstall(f"cuda{cuda_major}", f"transformer_engine[pytorch,core_cu{cuda_major}]=={TE_VERSION}",
                         ("--no-build-isolation",))
    if cuda_major is not None:
        raise NoTransformerEngine(f"Transformer Engine {TE_VERSION} is built for CUDA 12 and 13; the installed "
                                  f"torch {torch_version} is a CUDA {cuda_major} build")
    raise NoTransformerEngine(f"Transformer Engine needs a CUDA or ROCm torch; the installed torch {torch_version} "
                              "is a CPU build (FP8 and context parallel run on GPUs only)")


def _cuda_major(label: str, cuda: str | None) -> int | None:
    match = re.fullmatch(r"cu(\d{2,3})", label)
    if match:
        return int(match.group(1)[:-1])  # cu128 -> 12, cu130 -> 13, cu92 -> 9
    if not label and cuda:
        return int(cuda.split(".")[0])
    return None


def installed_torch() -> tuple[str, str | None, str | None] | None:
    """(version, torch.version.cuda, torch.version.hip) of the installed torch, None without one."""
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__, torch.version.cuda, torch.version.hip


def installed_te() -> str | None:
    import importlib.metadata

    for name in ("transformer_engine", "transformer-engine-torch"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
