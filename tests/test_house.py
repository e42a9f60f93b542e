"""The house's rules, checked on the code itself (the import layers are `lint-imports`' job, in CI):

- at most 10 modules directly in ``vit_demo/`` (the rest lives in one folder per layer);
- no private name (``_x``) imported from another module of the project;
- no function over 60 lines, in ``vit_demo/`` or ``app.py`` (a docstring's reason no longer excuses one);
- every command of the CLI is a module of ``vit_demo/cli/`` in ``COMMANDS``, every tab a module
  of ``vit_demo/app/tabs/`` in ``TABS``, its id the module's name;
- one name per concept: no class name defined twice in ``vit_demo/``;
- no "issue N" in the code or the docs: a reader cannot follow it; the text says what the code guards;
- a test that starts the app or a browser is in the slow tier (``tests/conftest.py`` marks it).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vit_demo"
MAX_LINES = 60


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_few_modules_at_the_top():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 10, top


def test_no_private_name_crosses_a_module():
    found = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            ours = isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("vit_demo"))
            if ours:
                found += [f"{path.relative_to(PACKAGE)}:{node.lineno} {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, found


def long_functions(paths: list[Path], root: Path = ROOT) -> list[str]:
    """``path:line name (n lines)`` of every function over :data:`MAX_LINES` lines, whatever its docstring says."""
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    out.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_long_function(tmp_path):
    assert not long_functions([*sources(), ROOT / "app.py"])
    sample = tmp_path / "vit_demo" / "sample.py"  # the check itself finds one, a reason in its docstring or not
    sample.parent.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    sample.write_text(f"def f():\n{body}\n")
    assert long_functions([sample], tmp_path) == [f"vit_demo/sample.py:1 f ({MAX_LINES + 1} lines)"]
    sample.write_text(f'def f():\n    """Long because it is a table."""\n{body}\n')
    assert long_functions([sample], tmp_path) == [f"vit_demo/sample.py:1 f ({MAX_LINES + 2} lines)"]


def test_every_command_and_tab_module_is_listed():
    from vit_demo.app.build import TABS
    from vit_demo.cli.main import COMMANDS

    commands = {p.stem for p in (PACKAGE / "cli").glob("*.py")} - {"__init__", "main", "common"}
    assert {c.__name__.rsplit(".", 1)[1] for c in COMMANDS} == commands
    tabs = {p.stem for p in (PACKAGE / "app" / "tabs").glob("*.py")} - {"__init__"}
    assert {t.__module__.rsplit(".", 1)[1] for t in TABS} == tabs
    assert [t.name for t in TABS] == [t.__module__.rsplit(".", 1)[1] for t in TABS]  # a tab's id is its module's name


def class_names(paths: list[Path], root: Path = ROOT) -> dict[str, list[str]]:
    """Every class name defined more than once over ``paths``, with where each is defined."""
    where = defaultdict(list)
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{path.relative_to(root)}:{node.lineno}")
    return {name: places for name, places in where.items() if len(places) > 1}


def test_one_class_per_name(tmp_path):
    assert not class_names(sources())
    for name in ("a.py", "b.py"):  # the check itself finds a name defined twice
        (tmp_path / name).write_text("class Batch:\n    pass\n")
    assert class_names([tmp_path / "a.py", tmp_path / "b.py"], tmp_path) == {"Batch": ["a.py:1", "b.py:1"]}


ISSUE = re.compile(r"\bissue ?#?[0-9]", re.IGNORECASE)


def issue_references(paths: list[Path], root: Path = ROOT) -> list[str]:
    """``path:line`` of every "issue N" or "issue #N" in ``paths``."""
    return [f"{path.relative_to(root)}:{i}" for path in paths
            for i, line in enumerate(path.read_text().splitlines(), 1) if ISSUE.search(line)]


def test_no_issue_number_in_code_or_docs(tmp_path):
    paths = [*sources(), ROOT / "app.py", ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert not issue_references(paths)
    sample = tmp_path / "sample.py"  # the check itself finds one
    sample.write_text("x = 1\n# the fix for Issue #12\ny = 2  # issue 7\nz = 3  # tissue 9, the issue of 2 lines\n")
    assert issue_references([sample], tmp_path) == ["sample.py:2", "sample.py:3"]


def test_no_tab_imports_another_tab():
    """A tab is its own module: what two tabs share lives beside them (e.g. ``app/uploads.py``,
    ``app/query.py``), and a tab another one opens is named, not imported."""
    from vit_demo.app.build import TABS
    from vit_demo.app.tabs.folder import OPEN_IN

    tabs = PACKAGE / "app" / "tabs"
    found = []
    for path in sorted(tabs.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and path.stem != "__init__":
                found.append(f"{path.name}:{node.lineno} from .{node.module or ''} import ...")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vit_demo.app.tabs"):
                found.append(f"{path.name}:{node.lineno} from {node.module} import ...")
    assert not found, found
    assert OPEN_IN in {t.name for t in TABS}


def starts_the_app() -> None:
    """A stub for the test below, never called: its source is what the conftest hook reads."""
    from app_server import running_app

    with running_app([]):
        pass


def test_what_starts_the_app_or_a_browser_leaves_the_fast_tier():
    """tests/conftest.py marks slow a test that calls, or uses a fixture that calls, one of its
    SLOW_CALLS: those are the helpers that start the app (tests/app_server.py) and a browser
    (Playwright's), so that a renamed helper cannot let such tests back into the fast tier unseen."""
    from types import SimpleNamespace

    import app_server
    from conftest import SLOW_CALLS, SLOW_FIXTURES, is_slow

    names = {call.rstrip("(") for call in SLOW_CALLS}
    assert names == {"running_app", "start_app", "sync_playwright"}
    assert all(callable(getattr(app_server, n)) for n in names - {"sync_playwright"})

    starts = starts_the_app  # (at module level: this test's own source must not start the app)

    def plain():
        pass

    def item(fn, marks=(), fixtures=None, names=()):
        info = SimpleNamespace(name2fixturedefs={k: [SimpleNamespace(func=f)] for k, f in (fixtures or {}).items()})
        return SimpleNamespace(function=fn, fixturenames=list(names), _fixtureinfo=info,
                               get_closest_marker=lambda m: m if m in marks else None)

    assert is_slow(item(starts)) and is_slow(item(plain, fixtures={"app": starts}))
    assert is_slow(item(plain, marks=("browser",))) and is_slow(item(plain, names=sorted(SLOW_FIXTURES)))
    assert not is_slow(item(plain, fixtures={"photos": plain}, names=["photos"]))
