"""Find preset files and expand ``extends:`` chains into ordered layers.

A preset *name* (``llama3_tiny.yaml``, ``llama/8b``) is looked up only inside the package's
preset folders and may not escape them. A *path* (absolute, or starting with ``./``,
``../`` is NOT a path but an escape attempt, ``~``) names the user's own file, relative to
the experiment file.
"""
from __future__ import annotations

from pathlib import Path

from primus.config.errors import ConfigError, did_you_mean
from primus.config.yaml_source import Layer, load_yaml_layer

CONFIGS_ROOT = Path(__file__).resolve().parent.parent / "configs"


def is_user_path(reference: str) -> bool:
    return reference.startswith(("/", "./", "~"))


def _with_suffix(name: str) -> str:
    return name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"


def find_preset(reference: str, search_dirs: list[Path], *, relative_to: Path, what: str, where: str) -> Path:
    """Resolve a preset reference to a file, refusing names that leave the preset folders."""
    if is_user_path(reference):
        path = Path(reference).expanduser()
        path = path if path.is_absolute() else (relative_to / path)
        if not path.is_file():
            raise ConfigError(f"{where}: {what} file '{reference}' not found (looked at {path.resolve()})")
        return path.resolve()
    name = _with_suffix(reference)
    for folder in search_dirs:
        candidate = (folder / name).resolve()
        if not candidate.is_relative_to(folder.resolve()):
            raise ConfigError(
                f"{where}: {what} name '{reference}' escapes the preset folder; "
                f"give a path starting with ./ or / to use your own file"
            )
        if candidate.is_file():
            return candidate
    known = sorted({p.relative_to(d).as_posix() for d in search_dirs if d.is_dir() for p in d.rglob("*.yaml")})
    searched = ", ".join(str(d.relative_to(CONFIGS_ROOT.parent)) if d.is_relative_to(CONFIGS_ROOT.parent) else str(d)
                         for d in search_dirs)
    raise ConfigError(f"{where}: unknown {what} '{reference}' (searched {searched}){did_you_mean(name, known)}")


def display_path(path: Path) -> str:
    """Short, stable names in messages: package presets relative to the package."""
    package = CONFIGS_ROOT.parent.parent
    try:
        return str(path.resolve().relative_to(package))
    except ValueError:
        try:
            return str(path.resolve().relative_to(Path.cwd()))
        except ValueError:
            return str(path)


# AMD Primus spells ``extends:`` as ``bases:`` in some presets; both mean the same, one per file.
PARENT_KEYS = ("extends", "bases")


def _pop_parents(layer: Layer, where: str) -> tuple[list[str] | None, str, str]:
    """The file's parent list (from ``extends:`` or its AMD Primus alias ``bases:``), its file:line,
    and how the line names them (the key, and the ``${VAR}`` template when there is one)."""
    present = [key for key in PARENT_KEYS if key in layer.data]
    if len(present) > 1:
        raise ConfigError(f"{layer.origins.get(present[1], where)}: both extends and bases are set; "
                          f"bases is AMD Primus's name for extends: keep one")
    if not present:
        return None, where, ""
    key = present[0]
    parents = layer.data.pop(key)
    line = layer.origins.pop(key, where)
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise ConfigError(f"{line}: {key} must be a file name or a list of file names")
    template = layer.templates.get(key)
    return parents, line, f"{key} (written {template!r}, an environment variable in it empty?)" if template else key


def load_with_extends(path: Path, label: str, _stack: tuple[Path, ...] = ()) -> list[Layer]:
    """The file's ``extends:`` (or ``bases:``) parents, depth first, in order, then the file itself."""
    path = path.resolve()
    if path in _stack:
        cycle = " -> ".join(display_path(p) for p in (*_stack, path))
        raise ConfigError(f"{display_path(path)}: extends cycle: {cycle}")
    layer = load_yaml_layer(path, label, display_path(path))
    parents, line, named = _pop_parents(layer, display_path(path))
    if parents is None:
        return [layer]
    layers: list[Layer] = []
    for parent in parents:
        parent_path = Path(parent).expanduser()
        parent_path = parent_path if parent_path.is_absolute() else path.parent / parent_path
        if not parent_path.is_file():
            raise ConfigError(f"{line}: {named} '{parent}' not found ({parent_path})")
        layers.extend(load_with_extends(parent_path, f"{label} (extends)", (*_stack, path)))
    layers.append(layer)
    return layers
