"""Engine-compatibility patches: one record for every engine, applied for one run and undone after it.

A ``Patch`` names an upstream problem and its fix: why (one line), the package whose version range
it was written against, the condition under which it is needed (``Condition``, evaluated for a
``Where``: this host, a named device, a run) and the function that applies it. The function makes
every replacement through ``Swaps``, so the ``Patcher`` that applied it can put each original
back: a dry-run, a plan or a test leaves the engine as it found it. Each backend lists its records
in one module (``primus.backends.<engine>.patches``); ``primus patches`` prints them.
"""
from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.version import Version

_MISSING = object()


@dataclass(frozen=True)
class Where:
    """What a condition may ask of the place a patch would apply: the device, and what the run uses.

    ``uses`` names the run's optional parts that have patches of their own (``float8``, ``llama4``,
    ``sft``); None when no run is named, so such patches are reported as "depends on the run".
    ``assumed``: a named device that is not this host, with its standard image's software (a CUDA/ROCm
    torch, which brings triton); conditions on other packages read this host's."""

    gpu: bool
    device: str = "cpu"
    uses: frozenset[str] | None = None
    assumed: bool = False

    @classmethod
    def here(cls, uses: Iterable[str] | None = None) -> "Where":
        """This process's device (torch's CUDA, which ROCm torch answers too)."""
        import torch

        gpu = torch.cuda.is_available()
        return cls(gpu, torch.cuda.get_device_name() if gpu else "cpu", None if uses is None else frozenset(uses))


@dataclass(frozen=True)
class Condition:
    """When a patch is needed, in words (``says``) and as a test of a ``Where``."""

    says: str
    holds: Callable[[Where], bool]
    needs_run: bool = False  # asks what the run uses: unknown without one

    def __and__(self, other: "Condition") -> "Condition":
        return Condition(f"{self.says} and {other.says}", lambda where: self.holds(where) and other.holds(where),
                         self.needs_run or other.needs_run)


ALWAYS = Condition("always (an upstream bug on every device)", lambda where: True)
NO_GPU = Condition("no CUDA/ROCm device", lambda where: not where.gpu)


def software(says: str, probe: Callable[[], bool]) -> Condition:
    """A fact of the installed packages (this host's, also for a named device: the same software)."""
    return Condition(says, lambda where: probe())


def uses(part: str, says: str) -> Condition:
    """The run uses ``part`` (a float8 model, a recipe): only a named run can say."""
    return Condition(says, lambda where: where.uses is not None and part in where.uses, needs_run=True)


@dataclass(frozen=True)
class Patch:
    """One upstream problem and its fix; ``apply`` makes every replacement through the ``Swaps`` it is given."""

    name: str
    why: str  # one line
    package: str  # the distribution whose version gates the patch
    versions: SpecifierSet
    when: Condition
    apply: Callable[["Swaps"], None]

    def installed(self) -> Version | None:
        try:
            return Version(importlib.metadata.version(self.package))
        except importlib.metadata.PackageNotFoundError:
            return None

    def in_range(self) -> bool:
        version = self.installed()
        return version is not None and self.versions.contains(version, prereleases=True)

    def verdict(self, where: Where) -> tuple[bool, str]:
        """(applies, the reason in words) for ``where``: the version range first, then the condition."""
        version = self.installed()
        if version is None:
            return False, f"{self.package} is not installed"
        if not self.in_range():
            return False, f"{self.package} {version} is outside {self.versions}"
        if where.uses is None and self.when.needs_run:
            return False, f"depends on the run: applies when {self.when.says}"
        if not self.when.holds(where):
            return False, f"not needed: applies when {self.when.says}"
        return True, f"{self.when.says}; {self.package} {version} in {self.versions}"


class Swaps:
    """Every replacement a patch makes, recorded so that ``restore`` puts the originals back (newest first)."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def _record(self, undo: Callable[[], None]) -> None:
        self._undo.append(undo)

    def set(self, owner: object, name: str, value: object) -> None:
        """``setattr(owner, name, value)``; undone by restoring the old value, or deleting what was not there
        (an inherited method, an attribute the patch adds)."""
        before = vars(owner).get(name, _MISSING)
        setattr(owner, name, value)
        self._record(lambda: setattr(owner, name, before) if before is not _MISSING else delattr(owner, name))

    def set_item(self, mapping: dict, key: object, value: object) -> None:
        before = mapping.get(key, _MISSING)
        mapping[key] = value
        self._record(lambda: mapping.__setitem__(key, before) if before is not _MISSING else mapping.pop(key))

    def enter(self, context: AbstractContextManager) -> None:
        """Enter ``context`` (a TorchFunctionMode, a scoped fix); exited on restore, in order with the rest."""
        stack = ExitStack()
        stack.enter_context(context)
        self._record(stack.close)

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()

    def __len__(self) -> int:
        return len(self._undo)


class _Permanent(Swaps):
    """A patch function called on its own (a script, a test): replacements are kept for the process."""

    def _record(self, undo: Callable[[], None]) -> None:
        pass


PERMANENT = _Permanent()


@dataclass
class Patcher:
    """Applies the patches that hold for ``where``, records what it applied and why, and undoes them.

    ``with Patcher(PATCHES, where) as applied:`` is how a run uses it; nothing is left applied on exit.
    """

    patches: list[Patch]
    where: Where
    applied: list[tuple[Patch, str]] = field(default_factory=list)
    skipped: list[tuple[Patch, str]] = field(default_factory=list)
    _swaps: Swaps = field(default_factory=Swaps)

    def apply(self, swaps: Swaps | None = None) -> "Patcher":
        if swaps is not None:
            self._swaps = swaps
        for patch in self.patches:
            ok, reason = patch.verdict(self.where)
            if not ok:
                self.skipped.append((patch, reason))
                continue
            patch.apply(self._swaps)
            self.applied.append((patch, reason))
        return self

    def undo(self) -> None:
        self._swaps.restore()
        self.applied.clear()

    def log(self, logger: logging.Logger, engine: str) -> None:
        """One debug line per patch applied (name, why, the condition that held: the rank's debug.log, not the
        console); a warning for a patch that the condition calls for but the installed version is outside the
        range it was written against."""
        for patch, reason in self.applied:
            logger.debug("%s patch applied: %s: %s [%s]", engine, patch.name, patch.why, reason)
        for patch, reason in self.skipped:
            needed = not patch.when.needs_run and patch.when.holds(self.where)
            if patch.installed() is not None and not patch.in_range() and needed:
                logger.warning("%s patch not applied: %s: %s (needed here: %s)", engine, patch.name, reason,
                               patch.when.says)
            else:
                logger.debug("%s patch not applied: %s: %s", engine, patch.name, reason)

    def names(self) -> list[str]:
        return [patch.name for patch, _ in self.applied]

    def __enter__(self) -> "Patcher":
        try:
            return self.apply()
        except BaseException:
            self.undo()
            raise

    def __exit__(self, *exc: object) -> None:
        self.undo()


def apply_for_process(patches: list[Patch], where: Where) -> list[str]:
    """Apply for the rest of the process (scripts and tests that build an engine outside a run); names applied."""
    return Patcher(patches, where).apply(PERMANENT).names()

