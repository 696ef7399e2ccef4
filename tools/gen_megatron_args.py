#!/usr/bin/env python3
"""Generate ``primus/backends/megatron/megatron_lm_args.py``: Megatron-LM's argparse arguments as data.

Megatron-LM's command line is built by ``megatron/training/arguments.py``: about 350 explicit
``group.add_argument(...)`` calls plus ``ArgumentGroupFactory(SomeConfig, exclude=[...])``, which
turns every field of a config dataclass (``TransformerConfig``, ``TrainingConfig``, ...) into an
argument. This script reads those sources from a Megatron-LM git checkout with ``ast`` (nothing
is imported or executed) and reproduces argparse's and the factory's rules:

- dest: ``dest=`` or the first long option, dashes -> underscores (``--disable-bias-linear`` ->
  ``add_bias_linear`` where the dataclass field says so);
- defaults: store_true -> False, store_false -> True, otherwise ``default=`` or None; the factory
  uses the field's default (``argparse_meta`` overrides it);
- the factory's type inference: ``X | None`` -> X, ``list[X]`` -> nargs '+', ``Literal[...]`` ->
  choices, an Enum -> its member names, ``bool`` -> store_true (default False) or
  store_false with ``--no-``/``--disable-`` options.

Anything it cannot model (an argument under a condition, an unknown default expression, a field
type argparse could not take) stops the script: a human looks at it rather than a guess.

    python tools/gen_megatron_args.py --git-dir /work/.mirror/NVIDIA+Megatron-LM/repo \\
        --commit d3528a2 [--out primus/backends/megatron/megatron_lm_args.py] [--check]
"""
from __future__ import annotations

import argparse
import ast
import importlib
import operator
import pprint
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "primus/backends/megatron/megatron_lm_args.py"
ARGUMENTS_PY = "megatron/training/arguments.py"
SOURCE_REPO = "NVIDIA/Megatron-LM"

# Default expressions that are not literals, with the value argparse holds when no env var is set.
KNOWN_EXPRESSIONS = {
    "int(os.getenv('WORLD_SIZE', '1'))": 1,  # --inprocess-active-world-size
    "int(os.getenv('LOCAL_RANK', '0'))": 0,  # DistributedInitConfig.local_rank
}
ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Pow: operator.pow}
# Argument groups added only when an optional package is present: not on a stock install.
CONDITIONAL_GROUPS = {
    "_add_kitchen_quantization_arguments": "only when NVIDIA Kitchen is installed (HAVE_KITCHEN)",
}
BUILTIN_TYPES = {"int", "float", "str", "bool"}
FIELDS = ("dest", "options", "type", "default", "choices", "nargs", "action", "group")


class UnsupportedSource(RuntimeError):
    """The upstream source does something this generator does not model: update it by hand."""


@dataclass
class Row:
    dest: str
    options: tuple[str, ...]
    type: str | None
    default: object
    choices: tuple | None
    nargs: object
    action: str
    group: str

    def as_tuple(self) -> tuple:
        return tuple(getattr(self, name) for name in FIELDS)


class GitSource:
    """Files of one commit of a git repository, parsed on demand."""

    def __init__(self, git_dir: str, commit: str):
        self.git_dir = git_dir
        self.commit = self._git("rev-parse", f"{commit}^{{commit}}").strip()
        self._trees: dict[str, ast.Module] = {}

    def _git(self, *args: str) -> str:
        return subprocess.run(["git", f"--git-dir={self.git_dir}", *args], check=True, capture_output=True,
                              text=True).stdout

    def exists(self, path: str) -> bool:
        return subprocess.run(["git", f"--git-dir={self.git_dir}", "cat-file", "-e", f"{self.commit}:{path}"],
                              capture_output=True).returncode == 0

    def module(self, dotted: str) -> tuple[ast.Module, str]:
        """The parsed source of a module of the repository (``a.b`` -> a/b.py or a/b/__init__.py)."""
        base = dotted.replace(".", "/")
        for path in (f"{base}.py", f"{base}/__init__.py"):
            if path in self._trees or self.exists(path):
                if path not in self._trees:
                    self._trees[path] = ast.parse(self._git("show", f"{self.commit}:{path}"), filename=path)
                return self._trees[path], path
        raise UnsupportedSource(f"module {dotted} not found at {self.commit}")


def _resolve_relative(module_path: str, level: int, name: str | None) -> str:
    package = module_path.removesuffix(".py").removesuffix("/__init__").split("/")
    if not module_path.endswith("__init__.py"):
        package = package[:-1]
    package = package[: len(package) - (level - 1)] if level > 1 else package
    return ".".join(package + ([name] if name else []))


def find_class(source: GitSource, module: str, name: str, seen: int = 0) -> tuple[ast.ClassDef, str]:
    """The ClassDef ``name`` as seen from ``module`` (following ``from x import name``)."""
    if seen > 10:
        raise UnsupportedSource(f"import chain for {name} too deep")
    tree, path = source.module(module)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node, path
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            original = next(a.name for a in node.names if (a.asname or a.name) == name)
            target = _resolve_relative(path, node.level, node.module) if node.level else node.module
            return find_class(source, target, original, seen + 1)
    raise UnsupportedSource(f"class {name} not found from {module}")


def import_origin(tree: ast.Module, path: str, name: str) -> str | None:
    """The module ``name`` is imported from in ``tree`` (None: not imported)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            return _resolve_relative(path, node.level, node.module) if node.level else node.module
        if isinstance(node, ast.Import) and any((a.asname or a.name) == name for a in node.names):
            return name
    return None


# ---------------------------------------------------------------- values

def literal(node: ast.AST, context: str):
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    text = ast.unparse(node)
    if text in KNOWN_EXPRESSIONS:
        return KNOWN_EXPRESSIONS[text]
    if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:  # 2 ** 32, 1024 * 1024
        return ARITHMETIC[type(node.op)](literal(node.left, context), literal(node.right, context))
    raise UnsupportedSource(f"{context}: cannot evaluate {text!r} statically (add it to KNOWN_EXPRESSIONS)")


class Enums:
    """Enum classes (megatron's, read from source; the stdlib's, imported) -> member names."""

    def __init__(self, source: GitSource):
        self.source = source

    def members(self, tree: ast.Module, path: str, name: str) -> list[str] | None:
        if "." in name:  # signal.Signals: a stdlib enum
            module, attr = name.rsplit(".", 1)
            if module.split(".")[0] in sys.stdlib_module_names:
                import enum

                value = getattr(importlib.import_module(module), attr)
                return list(value.__members__) if isinstance(value, type) and issubclass(value, enum.Enum) else None
            return None
        origin = import_origin(tree, path, name)
        try:
            cls, _ = find_class(self.source, origin, name) if origin else (
                next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), path)
        except (UnsupportedSource, StopIteration):
            return None
        if not any(ast.unparse(b).split(".")[-1] in {"Enum", "IntEnum", "StrEnum"} for b in cls.bases):
            return None
        return [t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]


def enum_default(node: ast.AST, choices: list[str]) -> str | None:
    """``AttnBackend.auto`` / ``signal.SIGTERM`` -> the member name argparse's handler takes."""
    if isinstance(node, ast.Attribute) and node.attr in choices:
        return node.attr
    return None


# ---------------------------------------------------------------- ArgumentGroupFactory

def _field_call(value: ast.AST | None) -> dict[str, ast.AST]:
    if isinstance(value, ast.Call) and ast.unparse(value.func) in {"field", "dataclasses.field"}:
        return {kw.arg: kw.value for kw in value.keywords}
    return {}


def dataclass_fields(source: GitSource, cls: ast.ClassDef, path: str) -> list[tuple[ast.AnnAssign, ast.Module, str]]:
    """``dataclasses.fields()`` order: the bases' fields first, a redefinition keeps its place."""
    fields: dict[str, tuple[ast.AnnAssign, ast.Module, str]] = {}
    tree, _ = source.module(path.removesuffix(".py").removesuffix("/__init__").replace("/", "."))
    for base in cls.bases:
        name = ast.unparse(base)
        origin = import_origin(tree, path, name)
        if origin is None and not any(isinstance(n, ast.ClassDef) and n.name == name for n in tree.body):
            continue  # object, Generic, ...
        base_cls, base_path = find_class(source, origin, name) if origin else (
            next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), path)
        for item in dataclass_fields(source, base_cls, base_path):
            fields[item[0].target.id] = item
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            annotation = ast.unparse(node.annotation)
            if annotation.startswith(("ClassVar", "typing.ClassVar", "InitVar")):
                continue
            fields[node.target.id] = (node, tree, path)
    return list(fields.values())


def _split_union(node: ast.AST) -> list[ast.AST] | None:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return (_split_union(node.left) or [node.left]) + (_split_union(node.right) or [node.right])
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in {"Union", "typing.Union"}:
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return list(items)
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in {"Optional", "typing.Optional"}:
        return [node.slice, ast.Constant(None)]
    return None


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def infer_type(annotation: ast.AST, tree, path, enums: Enums, context: str) -> dict:
    """``ArgumentGroupFactory._extract_type``: {'type', 'nargs', 'choices'} from an annotation."""
    union = _split_union(annotation)
    if union is not None:
        if len(union) == 2 and _is_none(union[1]):
            return infer_type(union[0], tree, path, enums, context)
        raise TypeError(f"Unions not supported by argparse: {ast.unparse(annotation)}")
    if isinstance(annotation, ast.Subscript):
        origin = ast.unparse(annotation.value)
        if origin in {"list", "List", "typing.List"}:
            items = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
            if len(items) != 1:
                raise TypeError(f"Multi-type lists not supported by argparse: {ast.unparse(annotation)}")
            return {**infer_type(items[0], tree, path, enums, context), "nargs": "+"}
        if origin in {"Literal", "typing.Literal"}:
            items = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
            choices = tuple(literal(i, context) for i in items)
            kinds = {type(c).__name__ for c in choices}
            if len(kinds) != 1:
                raise UnsupportedSource(f"{context}: Literal of mixed types")
            return {"type": kinds.pop(), "choices": choices}
        raise TypeError(f"Unsupported type: {ast.unparse(annotation)}")
    name = ast.unparse(annotation)
    if name in BUILTIN_TYPES:
        return {"type": name}
    members = enums.members(tree, path, name)
    if members is not None:
        return {"type": f"enum:{name.split('.')[-1]}", "choices": tuple(members)}
    # the factory passes any other class as argparse's type; upstream excludes those fields
    return {"type": name}


def _format_name(name: str, prefix: str | None = None) -> str:
    return "--" + ((prefix + "_" + name) if prefix else name).replace("_", "-")


def factory_rows(source: GitSource, module_tree, module_path, class_name: str, exclude: set[str],
                 group: str, enums: Enums) -> list[Row]:
    """The arguments ``ArgumentGroupFactory(class_name, exclude).build_group()`` adds, in order."""
    origin = import_origin(module_tree, module_path, class_name)
    cls, path = find_class(source, origin, class_name)
    rows = []
    for node, tree, field_path in dataclass_fields(source, cls, path):
        name = node.target.id
        call = _field_call(node.value)
        if name in exclude or ("init" in call and literal(call["init"], name) is False):
            continue
        context = f"{class_name}.{name}"
        if call:
            if "default" in call:
                default_node = call["default"]
            elif "default_factory" in call:
                factory_node = call["default_factory"]
                factory = ast.unparse(factory_node)
                default_node = {"list": ast.List([]), "dict": ast.Dict([], [])}.get(factory)
                if isinstance(factory_node, ast.Lambda):  # lambda: [] -> its body, evaluated as a default
                    default_node = factory_node.body
                if default_node is None:
                    raise UnsupportedSource(f"{context}: default_factory={factory}")
            else:
                raise UnsupportedSource(f"{context}: no default (the factory would fail)")
        elif node.value is not None:
            default_node = node.value
        else:
            raise UnsupportedSource(f"{context}: no default (the factory would fail)")
        meta = {}
        if "metadata" in call:
            metadata = literal_dict(call["metadata"], context)
            meta = metadata.get("argparse_meta", {})
        kwargs: dict = {"arg_names": [_format_name(name)], "dest": name}
        try:
            kwargs.update(infer_type(node.annotation, tree, field_path, enums, context))
        except TypeError as exc:
            if not meta:
                raise UnsupportedSource(f"{context}: {exc} and no argparse_meta (the factory raises)") from None
        choices = kwargs.get("choices")
        if kwargs.get("type", "").startswith("enum:"):
            default = enum_default(default_node, list(choices))
            if default is None and not _is_none(default_node):
                raise UnsupportedSource(f"{context}: enum default {ast.unparse(default_node)}")
        else:
            default = literal(default_node, context)
        kwargs["default"] = default
        if kwargs.get("type") == "bool":
            kwargs["action"] = "store_true" if default == False else "store_false"  # noqa: E712 (as upstream)
            kwargs.pop("type")
            if kwargs["action"] == "store_false":
                kwargs["arg_names"] = [_format_name(name, "no"), _format_name(name, "disable")]
        kwargs.update(meta)
        rows.append(Row(dest=kwargs["dest"], options=tuple(kwargs["arg_names"]), type=kwargs.get("type"),
                        default=kwargs["default"], choices=tuple(kwargs["choices"]) if kwargs.get("choices") else None,
                        nargs=kwargs.get("nargs"), action=kwargs.get("action", "store"), group=group))
    return rows


def literal_dict(node: ast.AST, context: str) -> dict:
    """A dict literal whose values may hold types (``{"type": str}``): names become their text."""
    if isinstance(node, ast.Dict):
        return {literal(k, context): literal_dict(v, context) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Name) and node.id in BUILTIN_TYPES:
        return node.id
    return literal(node, context)


# ---------------------------------------------------------------- explicit add_argument calls

def _action_name(node: ast.AST | None) -> str:
    if node is None:
        return "store"
    text = ast.unparse(node)
    if text in {"argparse.BooleanOptionalAction", "BooleanOptionalAction"}:
        return "boolean_optional"
    value = literal(node, "action")
    if value not in {"store", "store_true", "store_false", "store_const", "append", "count"}:
        raise UnsupportedSource(f"action {value!r}")
    return value


def _type_name(node: ast.AST | None) -> str | None:
    if node is None:
        return None
    if isinstance(node, ast.Lambda):
        return "lambda"
    return ast.unparse(node)


def explicit_row(call: ast.Call, group: str, enums: Enums, tree, path) -> Row:
    options = tuple(literal(a, "option") for a in call.args)
    kw = {k.arg: k.value for k in call.keywords if k.arg != "help"}
    action = _action_name(kw.get("action"))
    long = next((o for o in options if o.startswith("--")), options[0])
    dest = literal(kw["dest"], long) if "dest" in kw else long.lstrip("-").replace("-", "_")
    type_name = _type_name(kw.get("type"))
    if action == "boolean_optional":
        options = options + tuple("--no-" + o[2:] for o in options if o.startswith("--"))
        type_name = None  # argparse ignores it: the flag takes no value
    if action == "store_true":
        default = literal(kw["default"], long) if "default" in kw else False
    elif action == "store_false":
        default = literal(kw["default"], long) if "default" in kw else True
    elif "default" in kw:
        default = literal(kw["default"], long)
    else:
        default = None
    choices = literal(kw["choices"], long) if "choices" in kw else None
    nargs = literal(kw["nargs"], long) if "nargs" in kw else None
    return Row(dest=dest, options=options, type=type_name, default=default,
               choices=tuple(choices) if choices is not None else None, nargs=nargs, action=action, group=group)


# ---------------------------------------------------------------- the parser, in order

def _calls_in_order(body: list[ast.stmt], function: str):
    """The add_argument / ArgumentGroupFactory calls of a function body; refuse conditional ones."""
    for stmt in body:
        conditional = isinstance(stmt, (ast.If, ast.For, ast.While, ast.Try, ast.With))
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in {"add_argument", "build_group"}:
                if conditional:
                    raise UnsupportedSource(f"{function}: line {node.lineno} adds arguments conditionally")
                yield node


def collect(source: GitSource) -> list[Row]:
    tree, path = source.module("megatron.training.arguments")
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    entry = functions["add_megatron_arguments"]
    order = [n.value.func.id for n in entry.body
             if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name)]
    enums = Enums(source)
    rows: list[Row] = []
    for name in order:
        if name in CONDITIONAL_GROUPS:
            continue
        function = functions[name]
        group = name.removeprefix("_add_").removesuffix("_args").removesuffix("_arguments")
        factories: dict[str, tuple[str, set[str]]] = {}
        for stmt in function.body:  # var = ArgumentGroupFactory(Cls, exclude=...)
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and \
                    ast.unparse(stmt.value.func) == "ArgumentGroupFactory":
                call = stmt.value
                exclude_node = next((k.value for k in call.keywords if k.arg == "exclude"), None)
                if exclude_node is None and len(call.args) > 1:
                    exclude_node = call.args[1]
                exclude = set(_excluded(exclude_node, function)) if exclude_node is not None else set()
                factories[stmt.targets[0].id] = (ast.unparse(call.args[0]), exclude)
        for call in _calls_in_order(function.body, name):
            if call.func.attr == "build_group":
                class_name, exclude = factories[ast.unparse(call.func.value)]
                local_tree, local_path = tree, path
                rows += factory_rows(source, local_tree, local_path, class_name, exclude, class_name, enums)
            else:
                rows.append(explicit_row(call, group, enums, tree, path))
    return rows


def _excluded(node: ast.AST, function: ast.FunctionDef) -> list[str]:
    if isinstance(node, ast.Name):  # exclude=exclude, a list assigned earlier in the function
        for stmt in function.body:
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id for t in stmt.targets):
                return literal(stmt.value, "exclude")
        raise UnsupportedSource(f"{function.name}: exclude list {node.id} not found")
    return literal(node, "exclude")


def merge_duplicates(rows: list[Row]) -> list[Row]:
    """One row per dest: argparse keeps the first action's default; all option strings set it."""
    merged: dict[str, Row] = {}
    for row in rows:
        if row.dest in merged:
            first = merged[row.dest]
            first.options = first.options + tuple(o for o in row.options if o not in first.options)
        else:
            merged[row.dest] = row
    return list(merged.values())


# ---------------------------------------------------------------- output

HEADER = '''"""Megatron-LM's command-line arguments as data: one row per argument (its argparse ``dest``).

GENERATED by tools/gen_megatron_args.py -- do not edit; regenerate instead:
    {command}
Source: {repo} {arguments} at commit {commit}
(with the config dataclasses its ArgumentGroupFactory turns into arguments).

Columns: dest, option strings, type (argparse's ``type=`` by name; ``enum:X`` takes a member
name; None for flags), default (None included), choices, nargs, action, group (the
``_add_*_args`` function or the config dataclass the argument comes from).
"""

SOURCE_REPO = {repo!r}
SOURCE_COMMIT = {commit!r}
SOURCE_FILE = {arguments!r}
FIELDS = {fields!r}

ROWS = (
'''


def render(rows: list[Row], commit: str, command: str) -> str:
    out = HEADER.format(command=command, repo=SOURCE_REPO, arguments=ARGUMENTS_PY, commit=commit, fields=FIELDS)
    for row in rows:
        out += "    " + pprint.pformat(row.as_tuple(), width=10_000, sort_dicts=False) + ",\n"
    return out + ")\n"


def generate(git_dir: str, commit: str) -> str:
    source = GitSource(git_dir, commit)
    rows = merge_duplicates(collect(source))
    command = f"python tools/gen_megatron_args.py --git-dir MEGATRON_LM_GIT_DIR --commit {commit[:7]}"
    return render(rows, source.commit, command)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--git-dir", required=True, help="a Megatron-LM git directory (bare is fine)")
    parser.add_argument("--commit", default="d3528a2", help="the commit AMD Primus pins (default: d3528a2)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true", help="exit 1 if --out differs from a fresh generation")
    args = parser.parse_args(argv)
    text = generate(args.git_dir, args.commit)
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        print(f"{args.out}: {'up to date' if same else 'DIFFERS from a fresh generation'}")
        return 0 if same else 1
    args.out.write_text(text)
    print(f"wrote {args.out} ({text.count(chr(10)) - text[:text.index('ROWS = (')].count(chr(10)) - 2} arguments)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
