"""The package's shape: no import cycle among its modules, no module over 400 lines."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "adaptune"


def _module(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports, anywhere in the file (a function-level or a
    type-only import is still a dependency)."""
    name = _module(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            subs = {f"{base}.{a.name}" for a in node.names}
            found |= subs & modules or {base}                   # submodules, or names of ``base``
            found |= {base} if subs - modules else set()
    deps = set()
    for dep in found:
        while dep and dep not in modules:
            dep = dep.rpartition(".")[0]
        if dep and dep != name:
            deps.add(dep)
    return deps


def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in PKG.rglob("*.py")}
    return {m: _imports(p, set(files)) for m, p in files.items()}


def _cycle(graph) -> list[str] | None:
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                return stack[stack.index(d):] + [d]
            if d not in state and (c := visit(d)):
                return c
        state[m] = "done"
        stack.pop()
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_among_the_package_modules():
    graph = _graph()
    assert "adaptune.model.compile" in graph and graph["adaptune.tuner"]      # the walk sees the package
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_no_module_over_400_lines():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long
