"""Layers one way: the import-linter contracts of pyproject.toml hold, and no module imports itself in a circle."""
from __future__ import annotations

import logging

import pytest

from tests.helpers import ROOT

pytest.importorskip("importlinter")


def test_the_import_contracts_hold(capsys, monkeypatch):
    from importlinter.cli import lint_imports

    monkeypatch.chdir(ROOT)
    # lint_imports configures logging as its CLI (logging.config.dictConfig, which disables every logger that
    # exists): this pytest process's loggers are given back as they were, or later tests here log nothing
    loggers = [lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
    disabled = [lg.disabled for lg in loggers]
    try:
        code = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    finally:
        for logger, was in zip(loggers, disabled):
            logger.disabled = was
    assert code == 0, capsys.readouterr().out[-4000:]


def _circles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_in_a_circle():
    """Function-level imports count too: a circle postponed to call time is still a circle."""
    import grimp

    graph = grimp.build_graph("primus", include_external_packages=False, exclude_type_checking_imports=True)
    assert _circles(graph) == []


def test_the_circle_finder_finds_one():
    import grimp

    graph = grimp.ImportGraph()
    for importer, imported in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        graph.add_import(importer=importer, imported=imported)
    assert _circles(graph) == [["p.a", "p.b", "p.c"]]
