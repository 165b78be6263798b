"""Imports go one way: no module imports a higher layer, and no modules import each other in a cycle;
every third-party package imported is declared in pyproject.toml and locked in constraints.txt.

`LAYERS` is the one definition of the layering (issue 12): the base that every engine shares,
the engines, and the Tune/CLI layer on top. A module may import its own layer and the layers
below it; `INDEPENDENT` names parts of one layer that still may not import each other
(`scheduler_bridge`'s simulator and live allocator share its policies, and neither needs the
other). Every import statement counts, function-local and `TYPE_CHECKING` ones included: an
import hidden in a function to dodge a cycle is still a dependency a reader has to follow. So does
every module a package's table of lazy names (`hpo.base.lazy_names`) loads on first use: the one
place the project names its own modules in strings, checked here like an import.

The walk reads the source with `ast` and imports nothing. import-linter's layer contracts take
whole top-level packages as layers, while the base is a subpackage of `hpo` (the Tune layer) and
`scheduler_bridge` is layered inside; a small walk takes the module prefixes below as they are.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from dataclasses import dataclass
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: The project's packages (pyproject's `packages.find`); imports of anything else are not checked.
PACKAGES = ("hpo", "fusion", "pipeline_bubble", "scheduler_bridge")
#: Lowest first: (layer, the module prefixes in it). A module is in the layer of its longest prefix.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # the workload contract, hyperparameters, one trial state, actor names and the namespace
    ("base", ("hpo.base",)),
    # the built-in example workloads, written on the base's contract alone: the engines may measure
    # them (`hpo profile colocate`), and sweeps name them (`trainable: mlp_digits`)
    ("examples", ("hpo.examples",)),
    ("engine: fusion", ("fusion",)),
    ("engine: pipeline_bubble", ("pipeline_bubble",)),  # bubble guests train fused groups
    # scheduler_bridge, bottom up: the model of jobs and cluster that both sides share, the policies
    # (pure decisions), the trace simulator beside the live allocator (it lends pipeline bubbles),
    # each with its command line, and on top its public names
    ("engine: scheduler_bridge model", tuple(f"scheduler_bridge.{m}" for m in (
        "jobs", "cluster", "app_profiles", "interference", "power_model", "data_files"))),
    ("engine: scheduler_bridge.policies", ("scheduler_bridge.policies",)),
    ("engine: scheduler_bridge simulation, live", ("scheduler_bridge.simulation", "scheduler_bridge.live")),
    ("engine: scheduler_bridge", ("scheduler_bridge",)),
    # the Tune layer, bottom up: muP scaling (the proxy and the transfer, on the base alone); what a
    # sweep asks for (the schema, the sweep file, the user's code, preflight: no Ray, no torch); what
    # it tells its user (results, progress, loggers, the dashboard actor); the sweep engines, one per
    # mode; the Tuner that composes one; and on top the `hpo` command and the package's public names
    ("tune: scaling", ("hpo.scaling",)),
    ("tune: config", ("hpo.config",)),
    ("tune: reporting", ("hpo.reporting",)),
    ("tune: engines", ("hpo.engines",)),
    ("tune: tuner", ("hpo.tuner",)),
    ("tune", ("hpo",)),  # the `hpo` command and `hpo`'s public names
)
#: Groups of module prefixes none of which may import another of its group, whatever their layers:
#: the simulator and the live allocator share the policies, and either can be read without the other.
INDEPENDENT: tuple[tuple[str, ...], ...] = (("scheduler_bridge.simulation", "scheduler_bridge.live"),)


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.imported}"


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[Import]:
    """Every import between modules of `packages` under `root`, wherever in a module it is written."""
    files = {module_name(root, path): path for package in packages for path in sorted((root / package).rglob("*.py"))}
    found = []
    for importer, path in files.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        targets = [(target, node.lineno) for node in ast.walk(tree)
                   for target in _targets(node, importer, is_package, files)]
        for target, line in [*targets, *lazy_names_table(tree)]:
            imported = _nearest_module(target, files)
            if imported is not None and imported != importer:
                found.append(Import(importer, imported, line))
    return found


def lazy_names_table(tree: ast.Module) -> list[tuple[str, int]]:
    """(module, line) of each entry in the table a package's `__init__` gives `lazy_names`: a module
    and the names it defines."""
    tables = {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
              for target in node.targets if isinstance(target, ast.Name)}
    found = []
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "lazy_names" and len(call.args) == 2:
            table = call.args[1]
            table = tables.get(table.id) if isinstance(table, ast.Name) else table
            if isinstance(table, ast.Dict):
                found += [(key.value, key.lineno) for key in table.keys
                          if isinstance(key, ast.Constant) and isinstance(key.value, str)]
    return found


def _targets(node: ast.AST, importer: str, is_package: bool, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = importer.split(".")
        anchor = package[: len(package) - node.level + (1 if is_package else 0)]
        base = ".".join([*anchor, base] if base else anchor)
    # `from package import name` depends on the submodule `package.name` when there is one
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]


def _nearest_module(target: str, modules: dict[str, Path]) -> str | None:
    parts = target.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def _in_prefix(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str, layers=LAYERS) -> int | None:
    """Index in `layers` of the layer whose longest prefix names `module` (or a package above it)."""
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if _in_prefix(module, prefix):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index)
    return None if best is None else best[1]


def layer_violations(imports: list[Import], layers=LAYERS) -> list[str]:
    """The imports from a lower layer up to a higher one, one line each."""
    found = []
    for edge in imports:
        low, high = layer_of(edge.importer, layers), layer_of(edge.imported, layers)
        if low is not None and high is not None and low < high:
            found.append(f"{edge} ({layers[low][0]} -> {layers[high][0]})")
    return sorted(set(found))


def independence_violations(imports: list[Import], independent=INDEPENDENT) -> list[str]:
    """The imports from one member of an independent group into another, one line each."""
    found = []
    for group in independent:
        for edge in imports:
            importer = next((p for p in group if _in_prefix(edge.importer, p)), None)
            imported = next((p for p in group if _in_prefix(edge.imported, p)), None)
            if importer is not None and imported is not None and importer != imported:
                found.append(f"{edge} ({importer} and {imported} are independent)")
    return sorted(set(found))


def import_cycles(imports: list[Import]) -> list[list[str]]:
    """The groups of modules that import each other in a ring (strongly connected components, Tarjan)."""
    graph: dict[str, set[str]] = {}
    for edge in imports:
        graph.setdefault(edge.importer, set()).add(edge.imported)
        graph.setdefault(edge.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(cycles)


def import_report(root: Path, packages: tuple[str, ...] = PACKAGES, layers=LAYERS,
                  independent=INDEPENDENT) -> list[str]:
    """Everything wrong with the imports under `root`, one line each (empty: one-way layers, no cycles)."""
    imports = project_imports(root, packages)
    return [
        *layer_violations(imports, layers),
        *independence_violations(imports, independent),
        *(f"import cycle: {' <-> '.join(c)}" for c in import_cycles(imports)),
    ]


# ---- the checker's own specs, on small package trees ---------------------------------------------
def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root


TOY_LAYERS = (("base", ("core.types",)), ("engine", ("engine",)), ("top", ("core",)))
TOY = ("core", "engine")


def test_a_tree_whose_imports_go_down_only_passes(tmp_path):
    root = _tree(
        tmp_path,
        {
            "core/__init__.py": "",
            "core/types.py": "import dataclasses\n",
            "core/cli.py": "from engine import run\nfrom . import types\n",
            "engine/__init__.py": "",
            "engine/run.py": "from core.types import X\nfrom .helpers import h\n",
            "engine/helpers.py": "from ..core import types\n",
        },
    )
    assert import_report(root, TOY, TOY_LAYERS) == []


def test_an_upward_import_is_reported_with_its_line_even_inside_a_function(tmp_path):
    root = _tree(
        tmp_path,
        {
            "core/__init__.py": "",
            "core/types.py": "",
            "core/cli.py": "",
            "engine/__init__.py": "",
            "engine/run.py": "import os\n\ndef go():\n    from core import cli\n",
        },
    )
    assert import_report(root, TOY, TOY_LAYERS) == ["engine.run:4 imports core.cli (engine -> top)"]


def test_the_base_importing_an_engine_is_a_violation_though_both_sit_in_one_package_tree(tmp_path):
    root = _tree(
        tmp_path,
        {
            "core/__init__.py": "",
            "core/types.py": "from engine.run import go\n",
            "engine/__init__.py": "",
            "engine/run.py": "",
        },
    )
    assert import_report(root, TOY, TOY_LAYERS) == ["core.types:1 imports engine.run (base -> engine)"]


def test_a_ring_of_modules_is_reported_as_one_cycle(tmp_path):
    root = _tree(
        tmp_path,
        {
            "engine/__init__.py": "",
            "engine/a.py": "from engine import b\n",
            "engine/b.py": "from .c import thing\n",
            "engine/c.py": "def f():\n    import engine.a\n",
            "engine/d.py": "from engine import a\n",
        },
    )
    assert import_cycles(project_imports(root, ("engine",))) == [["engine.a", "engine.b", "engine.c"]]
    assert import_report(root, ("engine",), TOY_LAYERS) == ["import cycle: engine.a <-> engine.b <-> engine.c"]


def test_members_of_an_independent_group_may_not_import_each_other_though_their_layers_allow_it(tmp_path):
    root = _tree(
        tmp_path,
        {
            "engine/__init__.py": "",
            "engine/shared.py": "",
            "engine/sim/__init__.py": "",
            "engine/sim/run.py": "from ..shared import x\n",
            "engine/live/__init__.py": "",
            "engine/live/run.py": "from ..shared import x\nfrom ..sim.run import y\n",
        },
    )
    independent = (("engine.sim", "engine.live"),)
    assert import_report(root, ("engine",), TOY_LAYERS, independent) == [
        "engine.live.run:2 imports engine.sim.run (engine.live and engine.sim are independent)"
    ]


def test_the_longest_prefix_decides_a_modules_layer():
    assert layer_of("core.types.sub", TOY_LAYERS) == 0
    assert layer_of("core.typesetting", TOY_LAYERS) == 2
    assert layer_of("elsewhere", TOY_LAYERS) is None


# ---- the project itself --------------------------------------------------------------------------
def test_every_project_module_is_in_a_layer():
    modules = {module_name(REPO, p) for package in PACKAGES for p in (REPO / package).rglob("*.py")}
    assert sorted(m for m in modules if layer_of(m) is None) == []


def _top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).partition(".")[0] for alias in node.names}
    return names


def test_every_lazy_name_is_defined_in_the_module_its_package_names():
    missing = []
    for package in PACKAGES:
        for init in sorted((REPO / package).rglob("__init__.py")):
            tree = ast.parse(init.read_text(), str(init))
            tables = [node.value for node in tree.body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)]
            for module, line in lazy_names_table(tree):
                path = REPO / Path(*module.split("."))
                path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
                names = [name.value for table in tables for key, value in zip(table.keys, table.values)
                         if isinstance(key, ast.Constant) and key.value == module and key.lineno == line
                         for name in getattr(value, "elts", [])]
                if not path.is_file() or not set(names) <= _top_level_names(path):
                    missing.append(f"{init.relative_to(REPO)}:{line}: {names} not in {module}")
    assert missing == []


#: What the base must not import, so an engine built on it runs where Ray Tune is absent (a GPU box
#: running the fusion benchmarks) and a Tune upgrade cannot reach it.
TUNE = ("ray.tune", "ray.train", "ray.air")


def test_the_base_imports_no_ray_tune():
    found = []
    for path in sorted((REPO / "hpo" / "base").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [f"{node.module}.{alias.name}" for alias in node.names]
                     if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            found += [f"{path.relative_to(REPO)}:{node.lineno} imports {name}"
                      for name in names if any(_in_prefix(name, t) for t in TUNE)]
    assert found == []


def test_the_project_imports_go_one_way_without_cycles():
    problems = import_report(REPO)
    assert not problems, f"{len(problems)} import problems:\n" + "\n".join(problems)


@pytest.fixture(scope="module")
def bridge_imports() -> list[Import]:
    return project_imports(REPO, ("scheduler_bridge",))


def _bridge_problems(imports: list[Import], importer: str, imported: str) -> tuple[Import, list[str]]:
    """`imports` with one more, from `scheduler_bridge.importer` to `scheduler_bridge.imported`."""
    added = Import(f"scheduler_bridge.{importer}", f"scheduler_bridge.{imported}", 1)
    edges = [*imports, added]
    return added, [*layer_violations(edges), *independence_violations(edges)]


@pytest.mark.parametrize(
    ("importer", "imported", "layers"),
    [
        ("policies.queue", "simulation.metrics",
         "scheduler_bridge.policies -> engine: scheduler_bridge simulation, live"),
        ("policies.lucid", "live.client", "scheduler_bridge.policies -> engine: scheduler_bridge simulation, live"),
        ("jobs", "policies.queue", "scheduler_bridge model -> engine: scheduler_bridge.policies"),
    ],
)
def test_scheduler_bridge_model_sits_below_its_policies_which_import_neither_simulator_nor_live_allocator(
    bridge_imports, importer, imported, layers
):
    added, problems = _bridge_problems(bridge_imports, importer, imported)
    assert problems == [f"{added} (engine: {layers})"]


@pytest.mark.parametrize(
    ("importer", "imported", "pair"),
    [
        ("simulation.traces", "live.journal", "scheduler_bridge.simulation and scheduler_bridge.live"),
        ("live.driver", "simulation.metrics", "scheduler_bridge.live and scheduler_bridge.simulation"),
    ],
)
def test_the_simulator_and_the_live_allocator_import_not_each_other(bridge_imports, importer, imported, pair):
    added, problems = _bridge_problems(bridge_imports, importer, imported)
    assert problems == [f"{added} ({pair} are independent)"]


@pytest.mark.parametrize(
    ("importer", "imported", "layers"),
    [
        ("hpo.config.spec", "hpo.reporting.logging_callbacks", "tune: config -> tune: reporting"),
        ("hpo.reporting.progress", "hpo.engines.plain", "tune: reporting -> tune: engines"),
        ("hpo.engines.fused.engine", "hpo.tuner.tuner", "tune: engines -> tune: tuner"),
        ("hpo.tuner.sweep", "hpo.cli", "tune: tuner -> tune"),
    ],
)
def test_the_tune_layers_subpackages_import_only_those_below_them(importer, imported, layers):
    """What a sweep asks for (config) knows nothing of how it is reported, reporting nothing of the
    engines, the engines nothing of the Tuner that composes them."""
    added = Import(importer, imported, 1)
    assert layer_violations([added]) == [f"{added} ({layers})"]


# ---- third-party imports are declared and locked -------------------------------------------------
#: Where code that the tests, benchmarks or users run lives.
SOURCE_DIRS = (*PACKAGES, "examples", "benchmarks", "tests", "tools")


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_requirements() -> list:
    """Every requirement in pyproject.toml, core and extras, less the extras' references to the project."""
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    return [r for r in map(Requirement, lines) if _normalized(r.name) != _normalized(project["name"])]


def third_party_imports(root: Path, directories: tuple[str, ...] = SOURCE_DIRS) -> dict[str, str]:
    """Top-level names imported from outside the standard library and the checkout, with where (first seen)."""
    local = {path.stem for directory in directories for path in (root / directory).glob("*.py")}
    local |= {*directories}
    found: dict[str, str] = {}
    for directory in directories:
        for path in sorted((root / directory).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module]
                else:
                    continue
                for top in (name.partition(".")[0] for name in names):
                    if top not in sys.stdlib_module_names and top not in local:
                        found.setdefault(top, f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_every_imported_third_party_package_is_declared_in_pyproject():
    declared = {_normalized(r.name) for r in declared_requirements()}
    distributions = packages_distributions()
    undeclared = [
        f"{name} ({where})"
        for name, where in sorted(third_party_imports(REPO).items())
        if not declared & {_normalized(d) for d in distributions.get(name, [name])}
    ]
    assert not undeclared, f"imported but not declared in pyproject.toml: {', '.join(undeclared)}"


def test_the_lock_pins_every_declared_package_at_a_version_it_accepts():
    locked = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            locked[_normalized(name)] = version
    stale = [
        f"{r.name}{r.specifier} (locked: {locked.get(_normalized(r.name), 'missing')})"
        for r in declared_requirements()
        if locked.get(_normalized(r.name)) is None or not r.specifier.contains(locked[_normalized(r.name)])
    ]
    assert not stale, f"constraints.txt is stale, run `make lock`: {', '.join(stale)}"
