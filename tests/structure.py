#!/usr/bin/env python3
"""Fails when the code outgrows the shape the house keeps for its busiest parts.

What it checks, each a limit once reached and now held:

- No type's inherent `impl` over more than two files in the process executor (`exec/src`) and
  the leader's core (`engine/src/leader/core`): a type's behaviour is read in one place (its
  handlers are free functions over it, as in the leader's core), not gathered from a dozen.
- The node's agent module (`node/src/agent/mod.rs`) at most 400 lines, and the process
  executor's `Executor` at most 8 fields: each is a carrier of parts, not their sum.
- No production function over 80 lines without a `// Long (...)` comment just above it saying
  why (test code is left out: items under `#[cfg(test)]` and files named tests.rs).

It reads the sources, not the compiler, so it needs nothing but python3, and it is run by
`tests/layering.sh`. `tests/structure.py DIR` checks the workspace at DIR.
"""

import re
import sys
from collections import defaultdict
from pathlib import Path

IMPL_DIRS = ["exec/src", "engine/src/leader/core"]
IMPL_FILES_MAX = 2
LINES_MAX = {"node/src/agent/mod.rs": 400}
FIELDS_MAX = {("exec/src/executor/mod.rs", "Executor"): 8}
FN_LINES_MAX = 80

IMPL = re.compile(r"^\s*impl(?:<[^>]*>)?\s+([A-Z]\w*)\b[^{;]*\{", re.M)
FN = re.compile(r'^(\s*)(?:pub(?:\([^)]*\))? )?(?:async )?(?:const )?(?:unsafe )?(?:extern "C" )?fn (\w+)')


def production(path):
    return path.name != "tests.rs" and "tests" not in path.parts[:-1] and "fuzz" not in path.parts


def without_tests(text):
    """The text with every `#[cfg(test)]` item blanked (lines kept, so numbers still match)."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if re.match(r"\s*#\[cfg\(test\)\]", lines[i]):
            j, depth, opened = i + 1, 0, False
            while j < len(lines):
                depth += lines[j].count("{") - lines[j].count("}")
                opened = opened or "{" in lines[j]
                if (opened and depth <= 0) or (not opened and lines[j].rstrip().endswith(";")):
                    break
                j += 1
            for k in range(i, min(j + 1, len(lines))):
                lines[k] = ""
            i = j
        i += 1
    return "\n".join(lines)


def impl_spread(root):
    errors = []
    for d in IMPL_DIRS:
        files = defaultdict(set)
        for p in sorted((root / d).rglob("*.rs")):
            if not production(p.relative_to(root)):
                continue
            for m in IMPL.finditer(without_tests(p.read_text())):
                if " for " not in m.group(0):
                    files[m.group(1)].add(str(p.relative_to(root)))
        for ty, fs in sorted(files.items()):
            if len(fs) > IMPL_FILES_MAX:
                errors.append(f"{d}: `impl {ty}` in {len(fs)} files (at most {IMPL_FILES_MAX}): {', '.join(sorted(fs))}")
    return errors


def sizes(root):
    errors = []
    for f, most in LINES_MAX.items():
        n = (root / f).read_text().count("\n")
        if n > most:
            errors.append(f"{f}: {n} lines (at most {most})")
    for (f, ty), most in FIELDS_MAX.items():
        text = (root / f).read_text()
        m = re.search(r"^(?:pub(?:\([^)]*\))? )?struct " + ty + r"\b[^{]*\{(.*?)^\}", text, re.M | re.S)
        if not m:
            errors.append(f"{f}: no struct {ty}")
            continue
        fields = re.findall(r"^\s*(?:pub(?:\([^)]*\))? )?\w+\s*:", m.group(1), re.M)
        if len(fields) > most:
            errors.append(f"{f}: {ty} has {len(fields)} fields (at most {most})")
    return errors


def long_functions(root):
    errors = []
    for p in sorted(root.glob("**/src/**/*.rs")):
        rel = p.relative_to(root)
        if "target" in rel.parts or not production(rel):
            continue
        lines = without_tests(p.read_text()).split("\n")
        for i, line in enumerate(lines):
            m = FN.match(line)
            if not m or line.rstrip().endswith(";"):
                continue
            indent, end = m.group(1), i
            while end < len(lines) and lines[end].rstrip() != indent + "}":
                end += 1
            if end - i + 1 <= FN_LINES_MAX:
                continue
            above = i - 1
            while above >= 0 and re.match(r"\s*(//|#\[)", lines[above]) and "// Long (" not in lines[above]:
                above -= 1
            if above < 0 or "// Long (" not in lines[above]:
                errors.append(f"{rel}:{i + 1}: fn {m.group(2)} is {end - i + 1} lines, with no `// Long (...)` comment saying why")
    return errors


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
    errors = impl_spread(root) + sizes(root) + long_functions(root)
    for e in errors:
        print(f"structure: {e}", file=sys.stderr)
    if errors:
        return 1
    print("structure: impls in at most two files, the agent module and the Executor within bounds, long functions say why")
    return 0


if __name__ == "__main__":
    sys.exit(main())
