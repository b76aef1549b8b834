"""How the modules of crossbert_model and crossbert_eval depend on each other: the layering rules below, no import
cycle (a function-level import counts), no module reaching into another module's private names; no report function
changes module state."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = (REPO / "crossbert_model", REPO / "crossbert_eval")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in package.rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path):
    """(imported module, imported names) of every import statement outside `if TYPE_CHECKING:` blocks."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
        for n in ast.walk(node)
    }
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            yield ".".join(base + ([node.module] if node.module else [])), [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            yield from ((a.name, []) for a in node.names)


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {m: set() for m in modules}
    for name, path in modules.items():
        for module, names in _imports(name, path):
            for target in [module, *(f"{module}.{n}" for n in names)]:
                if target in modules and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


# The layering, one rule a line: (the modules a rule binds, the module they must not import, why).
COMPUTATION = (
    "crossbert_eval.probes",
    "crossbert_eval.probe_runner",
    "crossbert_eval.geometry",
    "crossbert_eval.geometry_runner",
    "crossbert_eval.mteb_runner",
    "crossbert_eval.mteb_encoder",
    "crossbert_eval.mteb_tasks",
    "crossbert_eval.encoders",
    "crossbert_eval.model_sources",
    "crossbert_eval.feature_cache",
    "crossbert_eval.evaluation",
    "crossbert_eval.results",
    "crossbert_eval.baselines",
    "crossbert_eval.metrics",
    "crossbert_eval.stats",
)
ORCHESTRATORS = ("crossbert_eval.cli", "crossbert_eval.sweep", "crossbert_model.train")  # the only ones that train
LAYERING = [
    ("crossbert_model", "crossbert_eval", "the model library knows nothing of evaluation"),
    (("crossbert_model.checkpoint",), "crossbert_model.train_config", "the checkpoint writer does not know the run schema"),
    (("crossbert_model.checkpoint",), "crossbert_model.model_card", "the trainer hands the checkpoint writer its card's text"),
    (COMPUTATION, "crossbert_eval.report", "computation does not import presentation"),
    ("*", "crossbert_model.train", "library modules never import the trainer (only what trains does)"),
]


def _bound(who, module: str) -> bool:
    if who == "*":
        return module not in ORCHESTRATORS
    return module in who if isinstance(who, tuple) else module == who or module.startswith(who + ".")


@pytest.mark.parametrize("who, forbidden, why", LAYERING, ids=[rule[2] for rule in LAYERING])
def test_the_layering_rules_hold(who, forbidden, why):
    graph = _graph()
    broken = sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        if _bound(who, m)
        for t in targets
        if t == forbidden or t.startswith(forbidden + ".")
    )
    assert broken == [], why


def test_no_module_of_either_package_imports_itself_back():
    graph = _graph()

    def reaches(start: str, goal: str, seen: set) -> bool:
        return any(n == goal or (n not in seen and not seen.add(n) and reaches(n, goal, seen)) for n in graph[start])

    assert [m for m in graph if reaches(m, m, set())] == []


def test_no_module_imports_another_modules_private_names():
    private = set()
    for name, path in _modules().items():
        for module, names in _imports(name, path):
            private |= {(name, module, n) for n in names if n.startswith("_") and module.startswith("crossbert")}
    assert private == set()


MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault", "pop", "popitem", "clear", "remove", "discard"}


def _writes_to_module_names(path: Path) -> list[str]:
    """Where a function changes a module-level name or an imported module's attribute: `X[k] = v`, `X.clear()`,
    `R.COLORS[k] = v`, `global X`."""
    tree = ast.parse(path.read_text())
    module_names = {
        t.id
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Name)
    }
    module_names |= {
        (a.asname or a.name).split(".")[0]
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for a in node.names
    }

    def base(node):
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    found = []
    for function in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        local = {a.arg for a in function.args.args + function.args.kwonlyargs}
        local |= {t.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) for t in [n]}
        for node in ast.walk(function):
            if isinstance(node, ast.Global):
                found.append(f"{function.name}: global {', '.join(node.names)}")
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
            for t in targets:
                if isinstance(t, (ast.Subscript, ast.Attribute)) and base(t) in module_names - local:
                    found.append(f"{function.name}: {ast.unparse(t)} = ...")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
                if base(node.func.value) in module_names - local:
                    found.append(f"{function.name}: {ast.unparse(node.func)}(...)")
    return found


@pytest.mark.parametrize(
    "module", sorted(m for m in _modules() if m.startswith("crossbert_eval.report") or m == "crossbert_eval.zoo")
)
def test_no_report_function_changes_module_state(module):
    """A report is a function of its folder: no build leaves anything behind that the next one sees (the zoo passes
    its palette in rather than patching the report's)."""
    assert _writes_to_module_names(_modules()[module]) == []


def test_the_state_check_catches_what_the_zoo_once_did(tmp_path):
    old = tmp_path / "old.py"
    old.write_text(
        "from . import report as R\nCAPTIONS = {}\n\ndef build(families, name):\n    CAPTIONS.clear()\n"
        "    for f in families:\n        R.COLORS[f] = 'red'\n    CAPTIONS[name] = 'x'\n"
    )
    assert sorted(_writes_to_module_names(old)) == [
        "build: CAPTIONS.clear(...)",
        "build: CAPTIONS[name] = ...",
        "build: R.COLORS[f] = ...",
    ]


def _command_line_options() -> set[str]:
    """Every option of every `crossbert` command."""
    from crossbert_eval.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    return {o for p in commands.values() for a in p._actions for o in a.option_strings if o.startswith("--")} - {"--help"}


def _options_in_raised_messages(path: Path, options: set[str]) -> list[str]:
    """`raise` statements of a module whose message text names a command-line option."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and node.exc is not None:
            text = " ".join(c.value for c in ast.walk(node.exc) if isinstance(c, ast.Constant) and isinstance(c.value, str))
            found += [f"{path.name}:{node.lineno}: {o}" for o in options if _option_pattern(o).search(text)]
    return found


def _option_pattern(option: str):
    import re

    return re.compile(rf"(?<![\w-]){re.escape(option)}(?![\w-])")


def test_no_library_error_names_a_command_line_option():
    """A library names the setting (a field, a keyword; CrossbertError's `setting`); the command line says it with its
    option (crossbert_eval.cli.settings_as_options), a zoo with its entry's field. An option named inside the library is
    wrong wherever else the library is called."""
    options = _command_line_options()
    assert {"--allow-pickle", "--max-length", "--trust-remote-code", "--data-root", "--push"} <= options
    library = {name: path for name, path in _modules().items() if name != "crossbert_eval.cli"}
    assert [hit for path in library.values() for hit in _options_in_raised_messages(path, options)] == []


def test_the_option_check_catches_a_message_that_names_one(tmp_path):
    old = tmp_path / "old.py"
    old.write_text('def load(n):\n    raise ValueError(f"--max-length {n}: too long; pass --allow-pickle")\n')
    assert sorted(_options_in_raised_messages(old, {"--max-length", "--allow-pickle", "--k"})) == [
        "old.py:2: --allow-pickle",
        "old.py:2: --max-length",
    ]
