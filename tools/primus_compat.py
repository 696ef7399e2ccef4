#!/usr/bin/env python3
"""Compatibility report: do an AMD Primus checkout's example experiments run here unchanged?

    python tools/primus_compat.py PRIMUS_CHECKOUT [--out docs/compat.md] [--jobs-from FILE ...]

For every example experiment (``examples/**/*.yaml`` with a ``modules:`` block) it runs, in this
process, what a user would for the device in the file's folder name (``MI300X`` -> ``--device
mi300x``): ``primus config validate EXP --device D``, ``primus plan EXP --nproc-per-node 8 --device
D`` and ``primus train EXP --dry-run --nproc-per-node 8 --device D``. Each runs the launch's own
admission (``primus.runtime.admission``) on that device, so a file counts as passing only if a real
``primus train`` on that device would start. It writes a Markdown table (file, result, first error),
a summary per device, and every admission refusal counted by key over all files (files with no
device in their path are admitted for ``DEFAULT_DEVICE``). In-process, so each engine is imported
once (a few minutes for the whole checkout). Families Primus does not run (Mamba / hybrid, Flux on
Megatron, MaxText, Megatron-Bridge, ...) must be refused by Primus in one line each; they are
counted apart from the transformer-LLM and AutoModel examples the target is measured on.

Make a checkout from the mirror: ``git --git-dir=/work/.mirror/AMD-AGI+Primus/repo worktree add
/tmp/amd-primus HEAD`` (or ``git archive HEAD examples | tar -x -C /tmp/amd-primus``).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
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
DEVICE_IN_PATH = re.compile(r"(?:^|/)(MI3\d\d)X?(?:/|$)")  # MLPerf's folders say MI355
DEFAULT_DEVICE = "mi355x"
# Not transformer LLMs (nor AutoModel): outside the population the target is measured on. Primus
# itself must refuse each in one line (primus/compat/families.py); the report checks that it does.
NOT_TRANSFORMER_LLM = re.compile(r"zebra_llama|mamba|hybrid|(^|/)diffusion/|flux")
# The dry-run checks the files a run reads: their cluster's data / checkpoint paths are absent here.
MISSING_INPUT = re.compile(r": \S+ does not exist( \(a [^)]*\))?$")
# A layout for more than one 8-GPU node, or a model whose per-rank state fits its device only when
# sharded over more ranks (AMD runs those on several nodes): the report also tries it on the nodes it needs.
NEEDS_NODES = re.compile(r"world size \(\d+\) is not divisible by|no known device has that much|"
                        r"GiB usable \(\d+% of \d+ GiB\)")


@dataclass
class Result:
    file: str
    framework: str
    in_target: bool  # a transformer-LLM or AutoModel example under MI300X/MI325X/MI355X
    result: str  # pass | needs inputs | pass on N nodes | refused | not admitted | fail: validate|plan|dry-run
    error: str = ""
    device: str = DEFAULT_DEVICE  # the target admission ran for
    refusals: tuple = ()  # every admission refusal on that device: (key, reason) pairs

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


def device_of(relative: str) -> str:
    """The device a file is written for, from its folder name (``MI355X`` -> ``mi355x``)."""
    match = DEVICE_IN_PATH.search(relative)
    return f"{match.group(1).lower()}x" if match else DEFAULT_DEVICE


def expected_refusal(framework: str, model: str) -> str | None:
    from primus.compat.families import framework_reason, model_reason

    return framework_reason(framework) or model_reason(framework, model)


def _primus(argv: list[str]) -> tuple[int, str, str]:
    """``primus ARGV`` in this process; (exit status, first line of its error, its output)."""
    from primus.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    except Exception as exc:  # a Primus bug, not a user error: the report says so
        return 99, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} (traceback: a Primus bug)", ""
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    error = next((line for line in lines if line.startswith("primus: error:")), lines[-1] if lines else "")
    return code, error.removeprefix("primus: error: "), out.getvalue()


def _steps(path: str, device: str, nodes: int = 1) -> list[tuple[str, list[str]]]:
    node_flags = ["-N", str(nodes), "--master-addr", "node0"] if nodes > 1 else []
    nodes_flag = ["-N", str(nodes)] if nodes > 1 else []
    return [("validate", ["config", "validate", path, "--device", device]),
            ("plan", ["plan", path, "--nproc-per-node", "8", *nodes_flag, "--device", device, "--json"]),
            ("dry-run", ["train", path, "--dry-run", "--nproc-per-node", "8", *node_flags, "--device", device])]


def _run_steps(path: str, device: str, nodes: int = 1) -> tuple[str | None, int, str]:
    """(the step that failed or None, its exit status, its first error line)."""
    for name, argv in _steps(path, device, nodes):
        code, error, out = _primus(argv)
        if name == "plan" and code == 1:  # the plan's memory verdict is not admission: only a layout error fails
            error = _plan_failure(out)
            code = 1 if error else 0
        if code != 0:
            return name, code, error
    return None, 0, ""


def _plan_failure(out: str) -> str:
    """The first layout problem or refusal of a ``plan --json`` that exited 1 ('' when it only does not fit)."""
    try:
        plan = json.loads(out)
    except ValueError:
        return out.strip().splitlines()[0] if out.strip() else "plan exited 1"
    refusals = (plan.get("admission") or {}).get("refusals") or []
    problems = [p["message"] for p in plan.get("problems", []) if p.get("level") == "fail"]
    return (refusals or problems or [""])[0]


def admission_refusals(path: Path, device: str) -> tuple[tuple[str, str], ...]:
    """Every refusal of the launch's admission on ``device`` as (key, reason), the layout not checked (any
    world size); () where the file is admitted or does not plan (its own error is reported instead)."""
    from primus.config.errors import ConfigError
    from primus.launch.experiment import resolve
    from primus.launch.job import plan_module, select_module
    from primus.plan.target import target_for
    from primus.runtime.admission import admit

    target = target_for(device)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            resolved = resolve(str(path), [])
            module = select_module(resolved, None)
            adapter, plan = plan_module(resolved, module, require_engine=False, target=target)
            admission = admit(adapter, plan, target, module.translations)
    except (ConfigError, SystemExit, Exception):  # noqa: BLE001 - the steps report it in their own words
        return ()
    return tuple((r.key, r.message) for r in admission.refusals)


def check(path: Path, checkout: Path) -> Result:
    relative = path.relative_to(checkout).as_posix()
    framework, model = _framework_and_model(path)
    target = in_target(relative, framework, model)
    family = expected_refusal(framework, model)
    device = device_of(relative)
    refusals = admission_refusals(path, device) if family is None else ()
    failed, code, error = _run_steps(str(path), device)
    if failed is not None and NEEDS_NODES.search(error):  # a multi-node layout: on the nodes it needs?
        for nodes in (2, 4, 8, 16):
            step, step_code, step_error = _run_steps(str(path), device, nodes)
            if step is None:
                os.environ["NNODES"] = "1"
                return Result(relative, framework, target, f"pass on {nodes} nodes",
                              error.replace(f"{checkout}/", ""), device, refusals)
            if not NEEDS_NODES.search(step_error):  # the layout fits these nodes; something else stops it
                failed, code, error = step, step_code, step_error
                break
    os.environ["NNODES"] = "1"
    if failed is None:
        return Result(relative, framework, target, "pass" if family is None else "fail: family not refused",
                      device=device, refusals=refusals)
    error = error.replace(f"{checkout}/", "")
    if family is not None and code == 2 and family in error:
        return Result(relative, framework, target, "refused", error, device)
    if code == 2 and refusals and refusals[0][1] in error:
        return Result(relative, framework, target, "not admitted", error, device, refusals)
    if failed == "dry-run" and code == 2 and MISSING_INPUT.search(error):
        return Result(relative, framework, target, "needs inputs", error, device, refusals)
    return Result(relative, framework, target, f"fail: {failed}", error, device, refusals)


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
    not_admitted = [r for r in target if r.result == "not admitted"]
    failures = [r for r in target if not r.passed and r.result not in ("needs inputs", "not admitted") and r not in multi]
    commit = _commit(checkout)

    def percent(*groups) -> str:
        return f"{100 * sum(map(len, groups)) / max(1, len(target)):.1f}%"

    lines = [
        f"Checkout: `{checkout}`{f' at {commit}' if commit else ''}; {len(results)} example experiments; "
        f"{seconds:.0f} s in one process.",
        "",
        f"**Transformer-LLM and AutoModel examples (MI300X / MI325X / MI355X): {len(passed) + len(multi)} / "
        f"{len(target)} are admitted on the device in their folder name and pass validate + plan + dry-run "
        f"unchanged on the nodes they are written for, 8 GPUs each ({percent(passed, multi)}): {len(passed)} on "
        f"one node (8 ranks), {len(multi)} layouts for 2 to 16 nodes (wider than one node, or whose per-rank "
        f"state fits its device only sharded over more ranks; planned and dry-run with `--nproc-per-node 8 -N "
        f"<nodes>`).** Each step runs with `--device <folder device>`, so the launch's own admission decides: "
        f"a device not on this host is assumed to carry its standard software (Transformer Engine included). "
        f"{len(not_admitted)} are refused by that admission (table by key below). {len(inputs)} more are admitted "
        f"and stop at the dry-run only because an input file the experiment names (their cluster's data, "
        f"tokenizer or checkpoint path) is absent here ({percent(passed, multi, inputs)} with them). "
        f"{len(refused)} more are not transformer-LLM examples (Mamba / hybrid, Flux, other trainers) and are "
        f"refused in one line each; {len(results) - len(target) - len(refused)} others lie outside the MI300X / "
        f"MI325X / MI355X example folders.",
        "",
        "| device | target files | admitted (pass) | admitted, multi-node | not admitted | needs inputs | fail |",
        "|---|---|---|---|---|---|---|",
    ]
    for device in TARGET_DEVICES:
        rows = [r for r in target if r.device == device.lower()]
        lines.append(f"| {device} | {len(rows)} | {sum(r.passed for r in rows)} | "
                     f"{sum(r.result.startswith('pass on') for r in rows)} | "
                     f"{sum(r.result == 'not admitted' for r in rows)} | "
                     f"{sum(r.result == 'needs inputs' for r in rows)} | "
                     f"{sum(r in failures for r in rows)} |")
    lines += ["", "| framework | pass | needs inputs | multi-node | not admitted | fail | refused (family) |",
              "|---|---|---|---|---|---|---|"]
    by_framework = collections.defaultdict(collections.Counter)
    for r in results:
        kind = "multi-node" if r.result.startswith("pass on") else \
            r.result if r.result in ("pass", "refused", "needs inputs", "not admitted") else "fail"
        by_framework[r.framework][kind] += 1
    for framework, counts in sorted(by_framework.items()):
        lines.append(f"| {framework} | {counts['pass']} | {counts['needs inputs']} | {counts['multi-node']} | "
                     f"{counts['not admitted']} | {counts['fail']} | {counts['refused']} |")
    lines += ["", refusal_table(results), "",
              "Why the other target examples do not pass (causes with file names and values taken out):", ""]
    for text, count in collections.Counter(cause(r.error) for r in failures).most_common(12):
        lines.append(f"- {count} × {text}")
    lines += ["", "Not transformer-LLM examples, refused:", ""]
    for text, count in collections.Counter(cause(r.error) for r in refused).most_common():
        lines.append(f"- {count} × {text}")
    lines += ["", "| file | device | result | first error |", "|---|---|---|---|"]
    for r in results:
        error = r.error.replace("|", "\\|")
        lines.append(f"| {r.file} | {r.device} | {r.result}"
                     f"{'' if r.in_target or r.result == 'refused' else ' (outside target)'} | {error} |")
    return "\n".join(lines) + "\n"


def _why(message: str) -> str:
    """A refusal's reason without the value and the target: what the table by key says once per key."""
    if re.search(r"cannot be (honoured|run) on ", message):
        text = re.sub(r"^.*?cannot be (honoured|run) on \S+ \(", "", message)
        text = re.sub(r"\)(; ignoring it would change the run.*|; supported: .*|)$", "", text)
    elif re.search(r"cannot run on (a CPU host|\S+ \([^)]*\)) \(", message):  # primus.plan.target's describe()
        text = re.sub(r"^.*?cannot run on (a CPU host|\S+ \([^)]*\)) \(", "", message)[:-1]
    elif message.endswith("(AMD Primus option; refused on " + message.rsplit(" ", 1)[-1]):
        # an AMD Primus option: "<value>: <why> (AMD Primus option; refused on <device>)"
        text = re.sub(r" \(AMD Primus option; refused on \S+\)$", "", message.split(": ", 1)[-1])
    else:
        text = message
    return text if len(text) <= 160 else text[:157] + "..."


def refusal_table(results: list[Result]) -> str:
    """Every admission refusal counted by key: files (all / in target) and the reason, first seen."""
    files, in_target, reasons = collections.Counter(), collections.Counter(), {}
    for r in results:
        for key in dict(r.refusals):
            files[key] += 1
            in_target[key] += r.in_target
        for key, reason in r.refusals:
            reasons.setdefault(key, _why(reason))
    lines = [f"Admission refusals by key, over all {len(results)} files on the device in their path "
             f"({DEFAULT_DEVICE} where the path names none); a file counts once per key it sets:", "",
             "| key | files | in target | why (first seen) |", "|---|---|---|---|"]
    for key, count in sorted(files.items(), key=lambda item: (-item[1], item[0])):
        lines.append(f"| `{key}` | {count} | {in_target[key]} | {reasons[key].replace('|', '/')} |")
    if not files:
        lines.append("| (none) | 0 | 0 | |")
    return "\n".join(lines)


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
