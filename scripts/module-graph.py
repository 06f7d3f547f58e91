#!/usr/bin/env python3
"""Checks that the modules of each crate import one another one way only,
and that lock-runtime's modules keep to their layers (ARCHITECTURE.md).

For every `.rs` file under `<crate>/src` it collects the paths the code names
through `crate::`, `super::` or `self::` (in `use` items and in expressions),
resolves each to the deepest module file that exists, and draws an edge from
the file's module to that module. `mod x;` declarations are the tree, not
imports, and are not edges. Test modules (`#[cfg(test)] mod tests` to the
end of the file) are left out. It fails when:

- the graph has a cycle (a module imports one that imports it back,
  directly or through others), or
- a module other than the crate root names an item through the root
  (`crate::Item`), which would hide where the item really lives, or
- (lock-runtime) a module imports one its layer may not: the API may use
  the engine, the engine the contract, a store only the contract, the
  stores' shared helpers and the errors; only `registry::stores` names a
  store; and no file of the API, the engine, the contract or the errors
  mentions a store's cargo feature (but `lib.rs`, which re-exports the
  stores, `store/mod.rs`, which declares them, and `registry/stores.rs`).

Usage: scripts/module-graph.py [--print] CRATE_DIR...
"""

import re
import sys
from pathlib import Path

# `$crate::..` in a macro body names a path in the caller's expansion: not
# an import of this module.
PATH = re.compile(r"(?<!\$)\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+|::\{)")
USE = re.compile(r"\buse\s+((?:crate|super|self)::[^;]*);", re.S)


def module_of(src: Path, file: Path) -> tuple:
    rel = file.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return tuple(parts)


def strip(code: str) -> str:
    code = re.sub(r"/\*.*?\*/", "", code, flags=re.S)
    code = re.sub(r"//[^\n]*", "", code)
    code = re.sub(r'"(?:\\.|[^"\\])*"', '""', code)
    test = re.search(r"#\[cfg\(test\)\]\s*mod\s+tests\b", code)
    return code[: test.start()] if test else code


def expand_use(tree: str) -> list:
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e]."""
    tree = re.sub(r"\s+", "", tree)
    brace = tree.find("{")
    if brace < 0:
        return [tree]
    prefix, body = tree[:brace], tree[brace + 1 : -1]
    items, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
    items.append(body[start:])
    return [p for item in items if item for p in expand_use(prefix + item)]


def resolve(path: str, here: tuple, modules: set):
    segments = path.split("::")
    base = list(here)
    head = segments.pop(0)
    if head == "super":
        base = base[:-1]
        while segments and segments[0] == "super":
            segments.pop(0)
            base = base[:-1]
    elif head == "crate":
        base = []
    target = tuple(base)
    for segment in segments:
        if segment == "self":
            break
        candidate = target + (segment,)
        if candidate not in modules:
            break
        target = candidate
    return target, len(segments) > 0


# lock-runtime's layers, top to bottom, by module path (the first rule
# that matches a module wins). A module may import its own layer and the
# layers listed for it.
LAYERS = [
    ("api", lambda m: m == () or m[0] in ("registry", "guard", "lock_all", "task_locks", "private", "options", "section", "job")),
    ("engine", lambda m: m[0] in ("acquire", "local_queue", "renewal", "telemetry")),
    ("common", lambda m: m[:2] == ("store", "common")),
    ("store", lambda m: m[0] == "store" and len(m) > 1 and m[1] in STORES),
    ("contract", lambda m: m[0] == "store"),
    ("error", lambda m: m[0] == "error"),
]
STORES = ("memory", "redis", "redlock", "postgres", "mysql", "etcd", "zookeeper")
MAY_USE = {
    "api": {"engine", "contract", "common", "error"},
    # The options are the API's plain data, which the engine reads.
    "engine": {"contract", "common", "error", "options"},
    "contract": {"error"},
    "common": {"contract", "error"},
    "store": {"contract", "common", "error"},
    "error": set(),
}
# The one module of the API that names stores: the one-line constructors.
NAMES_STORES = ("registry", "stores")
# Redlock is N Redis stores.
STORE_USES_STORE = {("redlock", "redis")}
STORE_FEATURES = re.compile(r'feature\s*=\s*"(redis|redis-tls|postgres|mysql|mysql-tls|etcd|etcd-tls|zookeeper)"')


def layer_of(module: tuple) -> str:
    for name, matches in LAYERS:
        if matches(module):
            return name
    return "?"


def allowed(here: tuple, target: tuple) -> bool:
    """Whether lock-runtime's module `here` may import `target`."""
    mine, theirs = layer_of(here), layer_of(target)
    if theirs == "store":
        if here == NAMES_STORES:
            return True
        return mine == "store" and (here[1] == target[1] or (here[1], target[1]) in STORE_USES_STORE)
    if mine == theirs:
        return True
    if mine == "engine" and target[:1] == ("options",):
        return True
    return theirs in MAY_USE[mine]


def check_layers(crate: Path, files: dict, edges: dict) -> bool:
    ok = True
    name = lambda m: "::".join(m) or "(root)"
    for module in sorted(edges):
        if layer_of(module) == "?":
            print(f"{crate.name}: layer: {name(module)} is in no layer (see LAYERS and ARCHITECTURE.md)")
            ok = False
    if not ok:
        return False
    for here in sorted(edges):
        for target in sorted(edges[here]):
            if not allowed(here, target):
                print(f"{crate.name}: layer: {name(here)} ({layer_of(here)}) may not import "
                      f"{name(target)} ({layer_of(target)})")
                ok = False
    for module, file in sorted(files.items()):
        # The crate root re-exports the stores, `store/mod.rs` declares
        # them, and their helpers are built for the stores that use them.
        if module in ((), ("store",), NAMES_STORES) or layer_of(module) in ("store", "common"):
            continue
        for line_no, line in enumerate(file.read_text().splitlines(), 1):
            feature = STORE_FEATURES.search(line)
            if feature:
                print(f"{crate.name}: layer: {file}:{line_no} names the store feature `{feature.group(1)}`")
                ok = False
    return ok


def check(crate: Path, show: bool) -> bool:
    src = crate / "src"
    files = {module_of(src, f): f for f in sorted(src.rglob("*.rs"))}
    modules = set(files)
    edges = {m: set() for m in modules}
    ok = True
    for here, file in files.items():
        code = strip(file.read_text())
        paths = [p for m in USE.finditer(code) for p in expand_use(m.group(1))]
        rest = USE.sub("", code)
        paths += [m.group(1) + m.group(2) for m in PATH.finditer(rest) if m.group(2) != "::{"]
        for path in paths:
            target, _ = resolve(path, here, modules)
            if target == here or (len(target) < len(here) and here[: len(target)] == target and target):
                # Its own items, or an enclosing module's (`super::` from a
                # store to the contract in `store/mod.rs`).
                if target == here:
                    continue
            if target == ():
                if here != ():
                    print(f"{crate.name}: {'::'.join(here)} names `{path}` through the crate root")
                    ok = False
                continue
            edges[here].add(target)
    name = lambda m: "::".join(m) or "(root)"
    if show:
        for m in sorted(edges):
            print(f"{crate.name}: {name(m)} -> {', '.join(sorted(name(t) for t in edges[m])) or '-'}")
    # Cycles: depth-first search with colours.
    state, stack = {}, []

    def visit(m):
        nonlocal ok
        state[m] = 1
        stack.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                cycle = stack[stack.index(t):] + [t]
                print(f"{crate.name}: cycle: {' -> '.join(name(c) for c in cycle)}")
                ok = False
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    if crate.resolve().name == "lock-runtime":
        ok = check_layers(crate, files, edges) and ok
        if show:
            for m in sorted(edges):
                print(f"{crate.name}: layer of {name(m)}: {layer_of(m)}")
    return ok


def main() -> int:
    args = sys.argv[1:]
    show = "--print" in args
    crates = [Path(a) for a in args if a != "--print"]
    results = [check(c, show) for c in crates]
    if all(results):
        print(f"module graph: no cycles in {', '.join(c.name for c in crates)}; lock-runtime keeps its layers")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
