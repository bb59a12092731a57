"""The layout of docs/design.md, read from the source: no two modules of raas import each other, and
the libraries (llm, sandbox, client, ...) import nothing of the server above them.

Every ``import`` counts, at module level, inside a function or under ``TYPE_CHECKING``: an import
moved into a function still makes the two modules one knot, it only hides it from the
interpreter. ``tests/client/test_client_imports.py`` checks what importing the client really loads
(third-party packages too); this file checks what every module names, without running it.
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

import raas
from tests.client.test_client_imports import ALLOWED_RAAS

RAAS = Path(raas.__file__).parent


@dataclass(frozen=True)
class Module:
    name: str
    path: Path

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


def modules(root: Path, package: str) -> dict[str, Module]:
    """Every Python module under ``root`` (the directory of ``package``), by dotted name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = Module(".".join(parts), path)
    return found


def _imported(module: Module, node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    """The modules of ``known`` that one import statement names.

    ``from pkg import sub`` names the submodule ``pkg.sub`` when there is one, else ``pkg`` (a
    name ``pkg/__init__.py`` defines or re-exports). So a package that imports its submodules to
    re-export them is not a knot with them, but a submodule that takes a re-exported name back
    from its own package is: it only works as long as ``__init__`` imports things in the right
    order. The parent packages that Python runs on the way to a module are not counted: nobody
    chose them.
    """
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in known]
    base = node.module or ""
    if node.level:
        parts = module.name.split(".")
        if not module.is_package:
            parts.pop()
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join([*parts, *([node.module] if node.module else [])])
    names = [f"{base}.{alias.name}" for alias in node.names]
    return [name if name in known else base for name in names if name in known or base in known]


def import_graph(found: dict[str, Module]) -> nx.DiGraph:
    """Module -> module it imports; each edge keeps the ``path:line`` of one import."""
    graph = nx.DiGraph()
    graph.add_nodes_from(found)
    for module in found.values():
        for node in ast.walk(ast.parse(module.path.read_text(), str(module.path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _imported(module, node, set(found)):
                    if target != module.name:
                        graph.add_edge(module.name, target, at=f"{module.path}:{node.lineno}")
    return graph


def knots(graph: nx.DiGraph) -> list[str]:
    """Each set of modules that import each other, named by one circle through it (from its
    first module by name) and where each of its imports is."""
    said = []
    for component in nx.strongly_connected_components(graph):
        if len(component) > 1:
            circle = [a for a, _ in nx.find_cycle(graph.subgraph(component))]
            start = circle.index(min(circle))
            circle = circle[start:] + circle[:start] + circle[start : start + 1]
            where = ", ".join(graph.edges[a, b]["at"] for a, b in itertools.pairwise(circle))
            rest = sorted(component - set(circle))
            knot = f" and with them {', '.join(rest)}" if rest else ""
            said.append(f"{' -> '.join(circle)} ({where}){knot}")
    return sorted(said)


GRAPH = import_graph(modules(RAAS, "raas"))


def test_no_two_modules_import_each_other() -> None:
    assert knots(GRAPH) == []


# What each library may import of raas (docs/design.md's table; itself always). "raas" alone is the
# root package, which holds the version and nothing else.
MAY_IMPORT = {
    "raas.llm": ("raas", "raas.helpers", "raas.paths"),
    "raas.sandbox": ("raas.helpers", "raas.images", "raas.paths"),
    "raas.sandbox.inside": (),  # runs in the sandbox on the image's own Python: stdlib only
    "raas.judge": ("raas.sandbox", "raas.wire"),  # answer checking included: nothing of tasks/
    "raas.judge.inside": (),  # runs in the judge's sandbox: stdlib only
    "raas.client": ALLOWED_RAAS,
    "raas.harness_agents": (),
    "raas.wire": (),
    "raas.helpers": (),
    "raas.images": ("raas.helpers", "raas.paths"),  # the image store: below the sandboxes
    "raas.images.refs": (),
    "raas.paths": (),
    "raas.images.overlay": (),  # also run alone by the host's python: stdlib only
    "raas.images.userns": (),  # run alone by the host's python (buildah as root): stdlib only
}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("library", sorted(MAY_IMPORT))
def test_libraries_import_nothing_of_what_sits_above_them(library: str) -> None:
    allowed = (library, *MAY_IMPORT[library])
    wrong = [
        f"{GRAPH.edges[source, target]['at']}: {source} imports {target}"
        for source, target in GRAPH.edges
        if _within(source, library)
        and not any(target == a or (a != "raas" and _within(target, a)) for a in allowed)
    ]
    assert wrong == []


# Console output is the command line's (raas.cli): the trainer SDK tells its caller through
# callbacks. (httpx itself loads rich and click where they are installed, so this is checked in
# the source, not in sys.modules.)
CONSOLE = ("rich", "click", "tqdm")


def test_the_sdk_prints_nothing() -> None:
    wrong = []
    for module in modules(RAAS / "client", "raas.client").values():
        for node in ast.walk(ast.parse(module.path.read_text(), str(module.path))):
            named = []
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                named = [node.module]
            if any(n.split(".")[0] in CONSOLE for n in named):
                wrong.append(f"{module.path}:{node.lineno}: imports {', '.join(named)}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                wrong.append(f"{module.path}:{node.lineno}: prints")
    assert wrong == []


def test_a_circle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    """The check sees what it must: a cycle hidden in a function, a relative import, and a
    submodule taking a name back from its package; not a package importing its submodules."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import A\nfrom pkg import sub\n")
    (pkg / "a.py").write_text("A = 1\n\ndef f():\n    from .b import B\n")
    (pkg / "b.py").write_text("from pkg.a import A\nB = 2\n")
    (pkg / "sub" / "__init__.py").write_text("from ..c import C\n")
    (pkg / "c.py").write_text("from pkg import A\nC = 3\n")
    said = knots(import_graph(modules(pkg, "pkg")))
    assert [s.split(" (")[0] for s in said] == [
        "pkg -> pkg.sub -> pkg.c -> pkg",
        "pkg.a -> pkg.b -> pkg.a",
    ]


def test_the_files_make_test_starts_first_exist() -> None:
    from tests.conftest import SLOW_FIRST

    root = Path(__file__).parents[1]
    assert len(set(SLOW_FIRST)) == len(SLOW_FIRST)
    assert [path for path in SLOW_FIRST if not (root / path).is_file()] == []
