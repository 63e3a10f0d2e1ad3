"""The package's folders are its layers: which module may import which, read statically with `ast`.

Every import of every module under mxnet_pfc/ counts, those inside functions too (a late import is
still a dependency). A failure prints each violation as "module imports module (file:line)".
"""
import ast
import tomllib
from pathlib import Path

from launch import REPO

PACKAGE = Path(REPO) / "mxnet_pfc"
# The modules a user runs (`python -m mxnet_pfc.NAME`, the mxnet-pfc-* scripts of pyproject.toml), and the
# one config.sh and the supervisor exec in each rank: nothing in the package imports them.
COMMANDS = {target.split(":")[0] for target in tomllib.loads((Path(REPO) / "pyproject.toml").read_text())[
    "project"]["scripts"].values()} | {"mxnet_pfc.runtime.rank"}
# What the head may use of the runtime: collectives, errors, seeding, file writing.
HEAD_RUNTIME = {f"mxnet_pfc.runtime.{name}" for name in ("comm", "errors", "seeding", "files")}
# The supervisor reads a run's checkpoints and checks its configuration before any host is used.
SUPERVISOR_READS = {"mxnet_pfc.training.checkpoint", "mxnet_pfc.training.config"}
# The supervisor runs outside the ranks and without MXNet: it uses horovodrun's own test of which hosts are
# local (comm, which imports MXNet, is Horovod's home in a rank).
SUPERVISOR_HOROVOD = "horovod.runner.util.network"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


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


def test_the_runtime_imports_no_higher_layer():
    def allowed(importer, imported):
        if importer == "mxnet_pfc.runtime.supervisor" and imported in SUPERVISOR_READS:
            return True
        return not within(importer, "mxnet_pfc.runtime") or not within(
            imported, *(f"mxnet_pfc.{layer}" for layer in ("head", "training", "data", "eval", "models")))
    assert_none(violations(allowed))


def test_data_imports_no_higher_layer():
    assert_none(violations(lambda importer, imported: not within(importer, "mxnet_pfc.data") or not within(
        imported, *(f"mxnet_pfc.{layer}" for layer in ("head", "training", "eval", "models")))))


def test_no_module_imports_a_command():
    # the doctor reads a rank's environment from the very functions config.sh's rank.py applies
    assert_none(violations(lambda importer, imported: imported not in COMMANDS
                           or (importer, imported) == ("mxnet_pfc.doctor", "mxnet_pfc.runtime.rank")))


def test_only_the_elastic_command_imports_the_supervisor():
    assert_none(violations(lambda importer, imported: imported != "mxnet_pfc.runtime.supervisor"
                           or importer == "mxnet_pfc.elastic"))


def test_only_comm_imports_horovod():
    assert_none(violations(lambda importer, imported: not within(imported, "horovod")
                           or importer == "mxnet_pfc.runtime.comm"
                           or (importer, imported) == ("mxnet_pfc.runtime.supervisor", SUPERVISOR_HOROVOD)))
