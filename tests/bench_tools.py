"""Import a script of tools/bench (not a package) as a module, for the tests that check it off the chip."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "tools" / "bench"


def load_bench(name: str) -> ModuleType:
    """``tools/bench/<name>.py`` as the module ``name`` (registered in ``sys.modules``, as its own imports of its
    neighbours expect)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
