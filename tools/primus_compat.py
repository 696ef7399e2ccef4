#!/usr/bin/env python3
"""Compatibility report: do an AMD Primus checkout's example experiments run here unchanged?

    python tools/primus_compat.py PRIMUS_CHECKOUT [--out docs/compat.md] [--jobs-from FILE ...]

For every example experiment (``examples/**/*.yaml`` with a ``modules:`` block) it runs, in this
process, what a user would: ``primus config validate EXP``, ``primus plan EXP --nproc-per-node 8``
and ``primus train EXP --dry-run --nproc-per-node 8``, and writes a Markdown table (file, result,
first error) with a summary. In-process, so each engine is imported once (a few minutes for the
whole checkout). Families Primus does not run (Mamba / hybrid, Flux on Megatron, MaxText,
Megatron-Bridge, ...) must be refused by Primus in one line each; they are counted apart from the
transformer-LLM and AutoModel examples the target is measured on.

Make a checkout from the mirror: ``git --git-dir=/work/.mirror/AMD-AGI+Primus/repo worktree add
/tmp/amd-primus HEAD`` (or ``git archive HEAD examples | tar -x -C /tmp/amd-primus``).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TARGET_FRAMEWORKS = ("megatron", "torchtitan", "nemo_automodel")
TARGET_DEVICES = ("MI300X", "MI325X", "MI355X")
# Not transformer LLMs (nor AutoModel): outside the population the target is measured on. Primus
# itself must refuse each in one line (primus/compat/families.py); the report checks that it does.
NOT_TRANSFORMER_LLM = re.compile(r"zebra_llama|mamba|hybrid|(^|/)diffusion/|flux")
# The dry-run checks the files a run reads: their cluster's data / checkpoint paths are absent here.
MISSING_INPUT = re.compile(r": \S+ does not exist( \(a [^)]*\))?$")
# A layout for more than one 8-GPU node: the report also tries it on the nodes it needs.
WORLD_SIZE = re.compile(r"world size \(\d+\) is not divisible by")


@dataclass
class Result:
    file: str
    framework: str
    in_target: bool  # a transformer-LLM or AutoModel example under MI300X/MI325X/MI355X
    result: str  # pass | needs inputs | pass on N nodes | refused | fail: validate|plan|dry-run
    error: str = ""

    @property
    def passed(self) -> bool:
        return self.result == "pass"


def experiments(checkout: Path) -> list[Path]:
    """Every YAML under examples/ whose top level holds a ``modules:`` mapping."""
    found = []
    for path in sorted((checkout / "examples").rglob("*.yaml")):
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            continue
        if isinstance(data, dict) and isinstance(data.get("modules"), dict):
            found.append(path)
    return found


def _framework_and_model(path: Path) -> tuple[str, str]:
    module = next(iter(yaml.safe_load(path.read_text())["modules"].values())) or {}
    return str(module.get("framework")), str(module.get("model") or "")


def in_target(relative: str, framework: str, model: str) -> bool:
    """A transformer-LLM or AutoModel example for an MI300X / MI325X / MI355X node."""
    parts = relative.split("/")
    under_devices = (len(parts) > 3 and parts[0] == "examples" and parts[1] in TARGET_FRAMEWORKS
                     and parts[2] == "configs" and parts[3] in TARGET_DEVICES)
    llm = framework != "megatron" or not (NOT_TRANSFORMER_LLM.search(relative) or NOT_TRANSFORMER_LLM.search(model))
    return under_devices and framework in TARGET_FRAMEWORKS and llm


def expected_refusal(framework: str, model: str) -> str | None:
    from primus.compat.families import framework_reason, model_reason

    return framework_reason(framework) or model_reason(framework, model)


def _primus(argv: list[str]) -> tuple[int, str]:
    """``primus ARGV`` in this process; (exit status, first line of its error)."""
    from primus.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    except Exception as exc:  # a Primus bug, not a user error: the report says so
        return 99, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} (traceback: a Primus bug)"
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    error = next((line for line in lines if line.startswith("primus: error:")), lines[-1] if lines else "")
    return code, error.removeprefix("primus: error: ")


def _plan_argv(path: str, nodes: int = 1) -> list[str]:
    from primus.cli.main import build_parser

    plan = build_parser()._subparsers._group_actions[0].choices["plan"]  # noqa: SLF001 (argparse has no API)
    flags = {option for action in plan._actions for option in action.option_strings}
    if "--nproc-per-node" in flags and (nodes == 1 or "-N" in flags):
        return ["plan", path, "--nproc-per-node", "8", *(["-N", str(nodes)] if nodes > 1 else [])]
    # an older `plan` reads the world size from the launcher's variables
    os.environ.update(GPUS_PER_NODE="8", NNODES=str(nodes))
    return ["plan", path]


def _steps(path: str, nodes: int = 1) -> list[tuple[str, list[str]]]:
    node_flags = ["-N", str(nodes), "--master-addr", "node0"] if nodes > 1 else []
    return [("validate", ["config", "validate", path]), ("plan", _plan_argv(path, nodes)),
            ("dry-run", ["train", path, "--dry-run", "--nproc-per-node", "8", *node_flags])]


def _run_steps(path: str, nodes: int = 1) -> tuple[str | None, int, str]:
    """(the step that failed or None, its exit status, its first error line)."""
    for name, argv in _steps(path, nodes):
        code, error = _primus(argv)
        if code != 0:
            return name, code, error
    return None, 0, ""


def check(path: Path, checkout: Path) -> Result:
    relative = path.relative_to(checkout).as_posix()
    framework, model = _framework_and_model(path)
    target = in_target(relative, framework, model)
    family = expected_refusal(framework, model)
    failed, code, error = _run_steps(str(path))
    if failed is not None and WORLD_SIZE.search(error):  # a multi-node layout: on the nodes it needs?
        for nodes in (2, 4, 8, 16):
            if _run_steps(str(path), nodes)[0] is None:
                return Result(relative, framework, target, f"pass on {nodes} nodes", error.replace(f"{checkout}/", ""))
    os.environ["NNODES"] = "1"
    if failed is None:
        return Result(relative, framework, target, "pass" if family is None else "fail: family not refused")
    error = error.replace(f"{checkout}/", "")
    if family is not None and code == 2 and family in error:
        return Result(relative, framework, target, "refused", error)
    if failed == "dry-run" and code == 2 and MISSING_INPUT.search(error):
        return Result(relative, framework, target, "needs inputs", error)
    return Result(relative, framework, target, f"fail: {failed}", error)


def cause(error: str) -> str:
    """The error with file names, line numbers and values taken out: errors that share a cause group."""
    text = re.sub(r"^\S+?\.yaml:\d+: ", "", error)
    text = re.sub(r"modules\.\w+\.", "", text)
    text = re.sub(r"'[^']*'", "'…'", text)
    text = re.sub(r"\(got [^)]*\)", "(got …)", text)
    text = re.sub(r"(?<![#\d])\d+(\.\d+)?", "N", text)  # issue numbers (#15) kept
    return text[:140]


def report(results: list[Result], checkout: Path, seconds: float) -> str:
    target = [r for r in results if r.in_target]
    passed = [r for r in target if r.passed]
    inputs = [r for r in target if r.result == "needs inputs"]
    multi = [r for r in target if r.result.startswith("pass on")]
    refused = [r for r in results if r.result == "refused" and not r.in_target]
    failures = [r for r in target if not r.passed and r.result != "needs inputs" and r not in multi]
    commit = _commit(checkout)

    def percent(*groups) -> str:
        return f"{100 * sum(map(len, groups)) / max(1, len(target)):.1f}%"

    lines = [
        f"Checkout: `{checkout}`{f' at {commit}' if commit else ''}; {len(results)} example experiments; "
        f"{seconds:.0f} s in one process.",
        "",
        f"**Transformer-LLM and AutoModel examples (MI300X / MI325X / MI355X): {len(passed) + len(multi)} / "
        f"{len(target)} pass validate + plan + dry-run unchanged on the nodes they are written for, 8 GPUs each "
        f"({percent(passed, multi)}): {len(passed)} on one node (8 ranks), {len(multi)} layouts for 2 to 16 nodes "
        f"(refused on 8 ranks in one line, and planned and dry-run with `--nproc-per-node 8 -N <nodes>`).** "
        f"{len(inputs)} more pass validate and plan and stop at the dry-run only because an input file the "
        f"experiment names (their cluster's data, tokenizer or checkpoint path) is absent here "
        f"({percent(passed, multi, inputs)} with them). "
        f"{len(refused)} more are not transformer-LLM examples (Mamba / hybrid, Flux, other trainers) and are "
        f"refused in one line each; {len(results) - len(target) - len(refused)} others lie outside the MI300X / "
        f"MI325X / MI355X example folders.",
        "",
        "| framework | pass | needs inputs | multi-node | fail | refused (family) |",
        "|---|---|---|---|---|---|",
    ]
    by_framework = collections.defaultdict(collections.Counter)
    for r in results:
        kind = "multi-node" if r.result.startswith("pass on") else \
            r.result if r.result in ("pass", "refused", "needs inputs") else "fail"
        by_framework[r.framework][kind] += 1
    for framework, counts in sorted(by_framework.items()):
        lines.append(f"| {framework} | {counts['pass']} | {counts['needs inputs']} | {counts['multi-node']} | "
                     f"{counts['fail']} | {counts['refused']} |")
    lines += ["", "Why the other target examples do not pass (causes with file names and values taken out):", ""]
    for text, count in collections.Counter(cause(r.error) for r in failures).most_common(12):
        lines.append(f"- {count} × {text}")
    lines += ["", "Not transformer-LLM examples, refused:", ""]
    for text, count in collections.Counter(cause(r.error) for r in refused).most_common():
        lines.append(f"- {count} × {text}")
    lines += ["", "| file | result | first error |", "|---|---|---|"]
    for r in results:
        error = r.error.replace("|", "\\|")
        lines.append(f"| {r.file} | {r.result}{'' if r.in_target or r.result == 'refused' else ' (outside target)'} "
                     f"| {error} |")
    return "\n".join(lines) + "\n"


def _commit(checkout: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="an AMD Primus checkout (its examples/ folder is read)")
    parser.add_argument("--out", type=Path, help="write the Markdown report here (default: stdout)")
    parser.add_argument("--only", help="regex: check only matching files (e.g. torchtitan)")
    args = parser.parse_args(argv)
    checkout = args.checkout.resolve()
    if not (checkout / "examples").is_dir():
        parser.error(f"{checkout}: no examples/ folder (an AMD Primus checkout?)")
    files = [p for p in experiments(checkout) if not args.only or re.search(args.only, str(p))]
    start = time.perf_counter()
    results = []
    environment, cwd = dict(os.environ), os.getcwd()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            os.chdir(scratch)  # relative workspaces and launcher files resolve here, never in a checkout
            os.environ.setdefault("PRIMUS_WORKSPACE", str(Path(scratch) / "output"))
            for i, path in enumerate(files, 1):
                results.append(check(path, checkout))
                print(f"[{i}/{len(files)}] {results[-1].result:<16} {results[-1].file}", file=sys.stderr, flush=True)
    finally:  # NNODES / GPUS_PER_NODE / PRIMUS_WORKSPACE set for the checks must not outlive them (in-process callers)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environment)
    text = report(results, checkout, time.perf_counter() - start)
    if args.out:
        write_report(args.out, text)
    else:
        print(text)
    return 0


BEGIN, END = "<!-- BEGIN tools/primus_compat.py report -->", "<!-- END tools/primus_compat.py report -->"


def write_report(path: Path, text: str) -> None:
    """Replace the report between the markers of an existing document (docs/compat.md), else write it."""
    block = f"{BEGIN}\n{text}{END}\n"
    if path.exists() and BEGIN in (old := path.read_text()) and END in old:
        head, rest = old.split(BEGIN, 1)
        path.write_text(head + block + rest.split(END, 1)[1].lstrip("\n"))
    else:
        path.write_text(block)


if __name__ == "__main__":
    sys.exit(main())
