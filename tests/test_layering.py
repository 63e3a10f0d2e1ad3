"""The package's folders are its floors: which module may import which, read statically with `ast`.

The floors, lowest first: runtime and symbols; head and data; models; eval; training; the commands (the
modules at the package's top). A module imports only from its own floor or lower ones, head and data not
from each other, and the import graph has no cycle. Every import of every module under mxnet_pfc/ and
symbols/ counts, those inside functions too (a late import is still a dependency). A failure prints each
violation as "module imports module (file:line)".
"""
import ast
import tomllib
from pathlib import Path

from launch import REPO

PACKAGE = Path(REPO) / "mxnet_pfc"
SYMBOLS = Path(REPO) / "symbols"
# The modules a user runs (`python -m mxnet_pfc.NAME`, the mxnet-pfc-* scripts of pyproject.toml), and the
# launcher config.sh and the supervisor exec in each rank: nothing in the package imports them.
COMMANDS = {target.split(":")[0] for target in tomllib.loads((Path(REPO) / "pyproject.toml").read_text())[
    "project"]["scripts"].values()} | {"mxnet_pfc.runtime.launch_rank"}
# Each folder's floor; symbols/ (the networks) stands beside the runtime; a module at the top is a command.
FLOORS = {"runtime": 0, "symbols": 0, "head": 1, "data": 1, "models": 2, "eval": 3, "training": 4}
COMMAND_FLOOR = 5
# What the head may use of the runtime: collectives, errors, seeding, file writing, rows scaled to length 1.
HEAD_RUNTIME = {f"mxnet_pfc.runtime.{name}" for name in ("comm", "errors", "seeding", "files", "vectors")}
# The supervisor runs outside the ranks and without MXNet: it uses horovodrun's own test of which hosts are
# local (comm, which imports MXNet, is Horovod's home in a rank).
SUPERVISOR_HOROVOD = "horovod.runner.util.network"
# What the supervisor reads of a run (checkpoints, failure records) is read without MXNet.
WITHOUT_MXNET = ("mxnet_pfc.runtime.supervisor", "mxnet_pfc.runtime.checkpoints", "mxnet_pfc.runtime.failure_records",
                 "mxnet_pfc.runtime.errors")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted([*PACKAGE.rglob("*.py"), *SYMBOLS.rglob("*.py")])}


def floor(name: str) -> "tuple[int, str]":
    """(floor, folder) of a module of ours: its folder's, or the commands' for a module at the top."""
    parts = name.split(".")
    folder = parts[0] if parts[0] == "symbols" else (parts[1] if len(parts) > 1 else "")
    return (FLOORS[folder], folder) if folder in FLOORS else (COMMAND_FLOOR, "commands")


def ours(name: str) -> bool:
    return name in MODULES


def imports(name: str) -> "list[tuple[str, int]]":
    """(imported module, line) of every import in module `name`; `from P import N` names P.N when that is a module."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:          # relative: from the package, or level - 1 packages up
                anchor = package.rsplit(".", node.level - 1)[0]
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append((full if full in MODULES else base, node.lineno))
    return found


def violations(allowed) -> "list[str]":
    """Every import, in every module, for which allowed(importer, imported) is false."""
    return [f"{importer} imports {imported} ({MODULES[importer].relative_to(REPO)}:{line})"
            for importer in MODULES for imported, line in imports(importer) if not allowed(importer, imported)]


def within(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def assert_none(found: "list[str]") -> None:
    assert not found, "layering violations:\n" + "\n".join(found)


def test_the_scan_sees_the_package_and_late_imports():
    assert {"mxnet_pfc.head.partial_fc", "mxnet_pfc.runtime.comm", "mxnet_pfc.train"} <= set(MODULES)
    assert "mxnet_pfc.runtime.comm" in [module for module, _ in imports("mxnet_pfc.head.partial_fc")]
    assert "horovod.mxnet" in [module for module, _ in imports("mxnet_pfc.runtime.comm")]    # inside a function


def test_the_head_uses_only_itself_and_the_runtimes_basics():
    assert_none(violations(lambda importer, imported: not within(importer, "mxnet_pfc.head")
                           or not within(imported, "mxnet_pfc") or within(imported, "mxnet_pfc.head")
                           or imported in HEAD_RUNTIME))


def test_every_import_goes_to_its_own_floor_or_a_lower_one():
    def allowed(importer, imported):
        if not ours(imported):
            return True
        (lower, here), (upper, there) = floor(imported), floor(importer)
        return lower < upper or (lower == upper and (here == there or here in ("runtime", "symbols")))
    assert_none(violations(allowed))


def test_the_floors_are_stated_for_every_folder():
    folders = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert folders == set(FLOORS) - {"symbols"}, "a folder without a floor: add it to FLOORS (and docs/DESIGN.md)"


def graph() -> "dict[str, set[str]]":
    return {name: {imported for imported, _ in imports(name) if ours(imported) and imported != name}
            for name in MODULES}


def cycles(edges: "dict[str, set[str]]") -> "list[list[str]]":
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(edges[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
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

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(cycle) for cycle in found)


def test_what_the_supervisor_reads_loads_no_mxnet():
    """Everything these modules import, directly or through others of ours, late imports included."""
    for start in WITHOUT_MXNET:
        seen, todo, reached = {start}, [start], []
        while todo:
            name = todo.pop()
            for imported, line in imports(name):
                if imported.split(".")[0] == "mxnet" or imported == "horovod.mxnet":
                    reached.append(f"{name} imports {imported} (line {line})")
                elif ours(imported) and imported not in seen:
                    seen.add(imported)
                    todo.append(imported)
        assert not reached, f"{start} reaches MXNet:\n" + "\n".join(reached)


def test_no_module_imports_a_command():
    assert_none(violations(lambda importer, imported: imported not in COMMANDS))


def test_only_the_elastic_command_imports_the_supervisor():
    assert_none(violations(lambda importer, imported: imported != "mxnet_pfc.runtime.supervisor"
                           or importer == "mxnet_pfc.elastic"))


def test_only_comm_imports_horovod():
    assert_none(violations(lambda importer, imported: not within(imported, "horovod")
                           or importer == "mxnet_pfc.runtime.comm"
                           or (importer, imported) == ("mxnet_pfc.runtime.supervisor", SUPERVISOR_HOROVOD)))
