"""Every script in benchmarks/ runs as its docstring says, ``python benchmarks/X.py ...``, from a
checkout that is not installed: each is run with ``--help`` in a fresh interpreter where vit_demo
cannot be imported from anywhere but the path the script itself adds (no ``PYTHONPATH``, no
editable install's finder, no site-packages entry that holds the package, cwd elsewhere). After
the module-level code of a script that imports vit_demo anywhere (in a function too), vit_demo
must import from this checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))

# One interpreter for all the scripts (torch is imported once); between two scripts sys.path and
# every module loaded from the checkout are put back as they were.
RUN_EACH = r"""
import ast, importlib.util, io, json, runpy, sys, traceback
from contextlib import redirect_stdout
from pathlib import Path

root, scripts = Path(sys.argv[1]), sys.argv[2:]
sys.meta_path = [f for f in sys.meta_path if not str(getattr(f, "__module__", "")).startswith("__editable__")]
sys.path_hooks = [h for h in sys.path_hooks if "editable" not in getattr(h, "__qualname__", repr(h)).lower()]
sys.path = [p for p in sys.path if p and not (Path(p) / "vit_demo").exists()]
sys.path_importer_cache.clear()
assert importlib.util.find_spec("vit_demo") is None, "vit_demo is importable before any script ran"
clean_path, result = list(sys.path), {}

def ours(module):  # the checkout's own modules, not those of a virtual environment inside it (CI's .venv)
    f = str(getattr(module, "__file__", None) or "")
    return f.startswith(str(root)) and not f.startswith((sys.prefix, sys.base_prefix))

def imports_the_package(script):  # anywhere in the script, in a function too
    nodes = list(ast.walk(ast.parse(Path(script).read_text())))
    names = [a.name for n in nodes if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in nodes if isinstance(n, ast.ImportFrom)]
    return any(name.split(".")[0] == "vit_demo" for name in names)

for script in scripts:
    sys.path[:] = [str(Path(script).parent), *clean_path]  # as `python benchmarks/X.py` starts
    for name in [n for n, m in sys.modules.items() if ours(m)]:
        del sys.modules[name]
    sys.path_importer_cache.clear()
    sys.argv = [script, "--help"]
    try:
        with redirect_stdout(io.StringIO()):
            runpy.run_path(script, run_name="__main__")
        error = "--help did not exit"
    except SystemExit as e:
        error = None if e.code in (0, None) else f"exit {e.code}"
    except BaseException:
        error = traceback.format_exc(limit=-3)
    spec = importlib.util.find_spec("vit_demo") if error is None else None
    if error is None and imports_the_package(script) and (spec is None or not str(spec.origin).startswith(str(root))):
        error = f"vit_demo is not importable from the checkout after the script's imports ({spec and spec.origin})"
    result[Path(script).name] = error
print(json.dumps(result))
"""


def test_every_benchmark_runs_from_a_checkout_that_is_not_installed(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    r = subprocess.run([sys.executable, "-c", RUN_EACH, str(ROOT), *map(str, SCRIPTS)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert sorted(result) == [p.name for p in SCRIPTS]
    failed = {name: error for name, error in result.items() if error}
    assert not failed, "\n\n".join(f"{name}: {error}" for name, error in failed.items())
