#!/usr/bin/env python3
"""Fails when the modules of a workspace crate import each other in a circle.

Cargo refuses a cycle between crates but not between the modules of one crate, and such a circle
is how one crate had grown into a 22-module knot before it was split into the crates that
docs/architecture.md describes.
This reads the sources, not the compiler, so it needs nothing but python3 (3.11: tomllib).

What counts, decided here once:

- A module is a file. An inline `mod x { ... }` belongs to the file it is written in (paths inside
  it are resolved from where it stands, but its edges are its file's).
- A file depends on another when it names it: in a `use` declaration, or in a path in code that
  starts with `crate::`, `super::`, `self::` or the name of a child module. `super::x` is a
  dependency on the parent if `x` is the parent's own item; `use super::*` is one on the parent.
- A name is followed through `use`: `super::core::Input`, where the parent holds
  `pub use htc_engine::leader::core`, is a dependency on htc_engine, not on the parent; a name a
  module imports from a sibling is a dependency on the sibling.
- Declaring a child (`mod x;`) is no dependency, and neither is a `pub use` by which a module
  re-exports what its own descendants define: a `mod.rs` that declares and re-exports its
  children is not in a circle with them. A parent that uses a child's items in its own code
  (a private `use`, a `child::f()` call, a field of the child's type) does depend on it, and is
  in a circle with that child if the child also uses the parent's own items.
- Circles are looked for between files, and between whole subtrees at each depth of the module
  tree: `slurm` using `leader::driver` while `leader/mod.rs` uses `slurm` is a circle between
  `slurm` and the `leader` subtree (shown as `leader/mod.rs*`), though no one file is in it twice.
- Test code is left out: items under `#[cfg(test)]` (the usual `mod tests { use super::*; }`),
  and files named tests.rs. So are integration tests, benches and examples.

It reads the source, not what the compiler resolved: a glob import (`use x::*`) is a dependency
on `x`, whatever it brings in, and a name that reaches a module only through a glob or a macro
is not followed further.

Every workspace member's library and binaries are read (`src/lib.rs`, `src/main.rs`,
`src/bin/*.rs`). Each circle is listed with the lines that make its edges; the exit status is 1
if there is one that `KNOWN` does not list. `tests/modcycles.py DIR` checks the workspace at DIR.
"""

import re
import sys
import tomllib
from pathlib import Path

# Circles found and left for now, each with why: a circle not listed fails, and so does a listed
# one that is gone or has changed, so that this list only shrinks.
KNOWN: dict[tuple[str, ...], str] = {}

TOKEN = re.compile(
    r"""(?P<skip>//[^\n]*|\s+)
      | (?P<str>b?r(?P<hashes>\#*)"|b?")
      | (?P<char>b?'(?:[^'\\\n]|\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]{1,6}\}|.))')
      | (?P<life>'[A-Za-z_][A-Za-z0-9_]*)
      | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<path>::)
      | (?P<punct>.)""",
    re.X | re.S,
)


def tokens(text):
    """(kind, text, line) of the Rust source, without comments, literals or lifetimes."""
    out, i, n, line, counted = [], 0, len(text), 1, 0
    while i < n:
        if text.startswith("/*", i):
            i = block_comment_end(text, i)
            continue
        m = TOKEN.match(text, i)
        kind = m.lastgroup if m.lastgroup != "hashes" else "str"
        line, counted = line + text.count("\n", counted, i), i
        if kind == "str":
            i = string_end(text, m)
            out.append(("lit", "", line))
            continue
        i = m.end()
        if kind == "char":
            out.append(("lit", "", line))
        elif kind in ("ident", "path", "punct"):
            out.append((kind, m.group(), line))
    return [("eof", "", line)] + out + [("eof", "", line)] * 3


def block_comment_end(text, i):
    depth = 0
    while i < len(text):
        if text.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif text.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        else:
            i += 1
    return i


def string_end(text, m):
    """Where the string literal starting at match `m` ends."""
    if m.group("hashes") is not None:
        close = '"' + m.group("hashes")
        end = text.find(close, m.end())
        return len(text) if end < 0 else end + len(close)
    i = m.end()
    while i < len(text) and text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i + 1


class Module:
    def __init__(self, path, file):
        self.path = path  # tuple of names from the crate root
        self.file = file  # the file it is written in
        self.children = {}  # name -> Module
        self.imports = {}  # name -> (segments, the Module the `use` is written in)
        self.uses = []  # (segments, line, re-export?) of every `use` leaf
        self.paths = []  # (segments, line) of paths in code


def parse_use_tree(toks, i):
    """The leaves of the use tree at toks[i:], as (segments, the name bound or None), and where
    it ends."""
    prefix, leaves = [], []
    while i < len(toks):
        kind, text, _ = toks[i]
        if kind == "path":
            i += 1
        elif text == "{":
            i += 1
            while toks[i][1] != "}":
                sub, i = parse_use_tree(toks, i)
                leaves += [(prefix + s, b) for s, b in sub]
                if toks[i][1] == ",":
                    i += 1
            return leaves, i + 1
        elif text == "*":
            return leaves + [(prefix, None)], i + 1
        elif kind == "ident" and text == "as":
            return leaves + [(prefix, toks[i + 1][1])], i + 2
        elif kind == "ident":
            prefix, i = prefix + [text], i + 1
        else:
            break
    if prefix and prefix[-1] == "self":
        prefix = prefix[:-1]
    return leaves + ([(prefix, prefix[-1])] if prefix else []), i


def skip_item(toks, i):
    """Index after the item starting at toks[i]: through its `;`, or its outer `{ ... }`."""
    depth = 0
    while i < len(toks):
        t = toks[i][1]
        if t in ("(", "["):
            depth += 1
        elif t in (")", "]"):
            depth -= 1
        elif t == ";" and depth == 0:
            return i + 1
        elif t == "{" and depth == 0:
            level = 0
            while i < len(toks):
                level += {"{": 1, "}": -1}.get(toks[i][1], 0)
                i += 1
                if level == 0:
                    return i
        i += 1
    return i


def attribute(toks, i):
    """If toks[i] starts an attribute: (index after it, whether it is a cfg that means tests, and
    whether it is an inner one, `#![...]`, which is about the whole module)."""
    inner = toks[i + 1][1] == "!"
    j = i + 1 + inner
    if toks[j][1] != "[":
        return None
    end, depth = j, 0
    while True:
        depth += {"[": 1, "]": -1}.get(toks[end][1], 0)
        end += 1
        if depth == 0 or toks[end][0] == "eof":
            break
    words = [t[1] for t in toks[j:end] if t[0] == "ident"]
    test = words[:1] == ["cfg"] and "test" in words and "not" not in words
    return end, test, inner


def read_module(crate, mod, file):
    """Reads `file` as module `mod`, and the child modules it declares, into `crate`."""
    toks = tokens(file.read_text())
    scopes = [(mod, None)]  # (module, the brace depth that closes it): inline modules nest
    depth, i, public = 0, 1, False
    while toks[i][0] != "eof":
        kind, text, line = toks[i]
        here = scopes[-1][0]
        if text == "#" and (attr := attribute(toks, i)):
            i, test, inner = attr
            if test and inner:
                break  # `#![cfg(test)]`: the whole module is test code
            if test:
                i = skip_item(toks, i)
            continue
        if text == "pub" and kind == "ident":
            public, i = True, i + 1
            if toks[i][1] == "(":  # `pub(crate)`
                i = next(k for k in range(i, len(toks)) if toks[k][1] == ")") + 1
            continue
        if text == "mod" and kind == "ident" and toks[i + 1][0] == "ident":
            name = toks[i + 1][1]
            child = Module(here.path + (name,), here.file)
            here.children[name] = child
            crate["modules"].append(child)
            if toks[i + 2][1] == ";":
                child.file = child_source(file, mod, here, name)
                if child.file.name != "tests.rs":
                    read_module(crate, child, child.file)
            else:
                scopes.append((child, depth))
                depth += 1
            i, public = i + 3, False
            continue
        if text == "use" and kind == "ident":
            leaves, i = parse_use_tree(toks, i + 1)
            for segs, bound in leaves:
                here.uses.append((segs, line, public))
                if bound and bound != "_":
                    here.imports[bound] = (segs, here)
            public = False
            continue
        if kind == "ident" and toks[i + 1][0] == "path" and toks[i - 1][0] != "path":
            segs, i = [text], i + 1
            while toks[i][0] == "path" and toks[i + 1][0] == "ident":
                segs.append(toks[i + 1][1])
                i += 2
            here.paths.append((segs, line))
            continue
        if text == "{":
            depth += 1
        elif text == "}":
            depth -= 1
            if scopes[-1][1] == depth:
                scopes.pop()
        if text in (";", "{", "}"):
            public = False
        i += 1


def child_source(file, file_mod, here, name):
    """The file of child module `name`, declared in `file` (module `file_mod`) inside `here`."""
    if file.name in ("mod.rs", "lib.rs", "main.rs") or not file_mod.path:
        base = file.parent
    else:
        base = file.with_suffix("")
    base = base.joinpath(*here.path[len(file_mod.path) :])
    flat = base / f"{name}.rs"
    return flat if flat.exists() else base / name / "mod.rs"


def resolve(crate, scope, segs, hops=0):
    """The module a path written in `scope` leads to (where its last name is defined), or None
    when it leaves the crate."""
    if not segs or hops > 16:
        return None
    cur = scope
    if segs[0] == "crate":
        cur, segs = crate["root"], segs[1:]
    elif segs[0] == "self":
        segs = segs[1:]
    elif segs[0] == "super":
        while segs and segs[0] == "super":
            cur, segs = crate["by_path"][cur.path[:-1]], segs[1:]
    elif segs[0] not in cur.children and segs[0] not in cur.imports:
        return None  # another crate, a std path, or a type's associated item
    for k, name in enumerate(segs):
        if name in cur.children:
            cur = cur.children[name]
        elif name in cur.imports:
            target, written_in = cur.imports[name]
            if target[:1] == [name] and written_in is cur:
                return None  # `use name;` of another crate
            return resolve(crate, written_in, target + segs[k + 1 :], hops + 1)
        else:
            break
    return cur


def read_crate(root_file):
    root = Module((), root_file)
    crate = {"root": root, "modules": [root]}
    read_module(crate, root, root_file)
    crate["by_path"] = {m.path: m for m in crate["modules"]}
    return crate


def edges_of(crate):
    """{file: {file it depends on: [the lines of the first that name the second]}}."""
    edges = {}
    for m in crate["modules"]:
        named = [(s, line, False) for s, line in m.paths if is_local_start(m, s[0])]
        for segs, line, reexport in m.uses + named:
            target = resolve(crate, m, segs)
            if target is None or target.file == m.file:
                continue
            if reexport and target.path[: len(m.path)] == m.path:
                continue  # a module re-exporting what its descendants define
            edges.setdefault(m.file, {}).setdefault(target.file, []).append(line)
    return edges


def is_local_start(m, first):
    return first in ("crate", "super", "self") or first in m.children


def cycles(edges):
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def levels(crate, edges):
    """For each depth d of the module tree, the graph between its subtrees d levels down (each
    file stands for its ancestor there; at the last depth, files are themselves): `a::x` using `b`
    while `b` uses `a` is a circle between `a` and `b`, whichever of their files it goes through.
    Yields ({node: {node: [(file, line, target file)]}}, {node: its files})."""
    path_of = {}
    for m in crate["modules"]:
        path_of.setdefault(m.file, m.path)  # a file's own module comes before its inline ones
    depth = max(len(p) for p in path_of.values())
    for d in range(1, depth + 1):
        key = {f: p[:d] for f, p in path_of.items()}
        graph, members = {}, {}
        for f, k in key.items():
            members.setdefault(k, set()).add(f)
        for a, targets in edges.items():
            for b, lines in targets.items():
                if key[a] != key[b]:
                    edge = graph.setdefault(key[a], {}).setdefault(key[b], [])
                    edge.extend((a, n, b) for n in lines)
        yield graph, members


def name(ws, crate, files, top):
    """A circle's member: its file, or its top module's file and `*` for a subtree."""
    file = crate["by_path"][top].file.relative_to(ws)
    return f"{file}*" if len(files) > 1 else str(file)


def circles(ws, crate):
    """Each circle as (its members' names, the lines that make its edges)."""
    seen = []
    for graph, members in levels(crate, edges_of(crate)):
        for comp in cycles(graph):
            files = {frozenset(members[k]) for k in comp}
            if files in seen:
                continue
            seen.append(files)
            lines = {}
            for a in comp:
                for b in comp:
                    for f, n, g in graph.get(a, {}).get(b, []):
                        lines.setdefault((f.relative_to(ws), g.relative_to(ws)), set()).add(n)
            why = [f"{f}:{','.join(map(str, sorted(n)))} -> {g}" 
                   for (f, g), n in sorted(lines.items())]
            yield tuple(sorted(name(ws, crate, members[k], k) for k in comp)), why


def crate_roots(ws):
    members = tomllib.loads((ws / "Cargo.toml").read_text())["workspace"]["members"]
    for member in members:
        src = ws / member / "src"
        for root in [src / "lib.rs", src / "main.rs", *sorted((src / "bin").glob("*.rs"))]:
            if root.exists():
                yield member, root


def err(*lines):
    print(*lines, sep="\n", file=sys.stderr)


def main():
    ws = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent.parent).resolve()
    found, known = [], []
    for member, root in crate_roots(ws):
        for circle, why in circles(ws, read_crate(root)):
            if circle in KNOWN:
                known.append(circle)
                continue
            found.append(circle)
            err(f"modcycles: {member}: these modules import each other in a circle:")
            err(*(f"    {m}" for m in circle), "  through:", *(f"    {w}" for w in why))
    for circle in KNOWN:
        if circle not in known:
            found.append(circle)
            err(f"modcycles: a known circle is gone or has changed; take it out of KNOWN: {circle}")
    for circle in known:
        print(f"modcycles: known, left for now: {' '.join(circle)}: {KNOWN[circle]}")
    if found:
        return 1
    print("modcycles: no other module of any workspace crate imports itself through others")
    return 0


if __name__ == "__main__":
    sys.exit(main())
