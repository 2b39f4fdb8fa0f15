"""Which cfg knobs a version's code can read: the names of `_common.KNOWN_KNOBS` that appear in
its module or in an int4_moe module it imports, directly or not.

Why: `_common.with_cfg` refuses a name that is no knob of int4_moe, but one vocabulary for the
op lets a knob of one version's line pass to another that never reads it: `DS` (cuda_v13's
split down GEMM) given to cuda_v21 timed cuda_v21's defaults under the label DS=1. The sweep CLI
(`triton_v5._cli_config`) refuses such a row by name; the op itself keeps the op-wide check (a
call's cfg may hold knobs of launches another T or hint takes, all within the version's code).

What counts as a mention (read from the source, never by running it): a string constant that is
not a docstring (`c["HOT"]`, `c.get("TB1")`, `{"HI": 16}`), a keyword argument's name
(`dict(stages=3)`), and an f-string whose formatted parts stand for digits (`f"KW{n}"`: KW1,
KW2). An over-approximation: a knob one branch of an imported module reads counts for every
version that imports it, so the check catches knobs of other lines, not every unread knob.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from pathlib import Path

from ._common import KNOWN_KNOBS

_HERE = Path(__file__).parent


def _not_reads(tree: ast.AST) -> set[int]:
    """ids of the string constants that name no knob a version reads: the docstrings of a
    module, class or function, and the vocabulary itself (`_common.KNOWN_KNOBS`)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "KNOWN_KNOBS" for t in node.targets):
            out |= {id(c) for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
    return out


def _f_pattern(node: ast.JoinedStr) -> re.Pattern | None:
    """An f-string as a pattern whose formatted parts are digits; None without a letter."""
    parts = [re.escape(v.value) if isinstance(v, ast.Constant) else r"\d"
             for v in node.values]
    text = "".join(parts)
    return re.compile(text) if re.search("[A-Za-z_]", text) else None


@functools.cache
def _module(name: str) -> tuple[frozenset, frozenset]:
    """(knobs mentioned in int4_moe module `name`, the int4_moe modules it imports)."""
    tree = ast.parse((_HERE / f"{name}.py").read_text())
    skip = _not_reads(tree)
    words, imports = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            words.add(node.value)
        elif isinstance(node, ast.keyword) and node.arg:
            words.add(node.arg)
        elif isinstance(node, ast.JoinedStr) and (p := _f_pattern(node)) is not None:
            words |= {k for k in KNOWN_KNOBS if p.fullmatch(k)}
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            mods = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
            imports |= {m for m in mods if (_HERE / f"{m}.py").exists()}
    return frozenset(words & KNOWN_KNOBS), frozenset(imports)


def knobs_read(version: str) -> frozenset:
    """The knobs that int4_moe version `version` (a module name, e.g. "cuda_v21", or its
    dotted path; "__main__" for the version whose CLI runs) or an int4_moe module it imports
    mentions (module docstring)."""
    return _closure(version_name(version))


def version_name(module: str) -> str:
    """The int4_moe module name of `module` (a dotted path, or "__main__": the version whose
    CLI runs, `python -m ...int4_moe.cuda_v22`, defines its op in module __main__)."""
    if module == "__main__":
        module = sys.modules["__main__"].__spec__.name
    return module.rsplit(".", 1)[-1]


@functools.cache
def _closure(name: str) -> frozenset:
    """`knobs_read` of int4_moe module `name`."""
    seen, todo, knobs = set(), [name], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        words, imports = _module(name)
        knobs |= words
        todo += imports
    return frozenset(knobs)
