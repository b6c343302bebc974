"""C++ kernels handed to inductor's compile workers as inductor generates them, not after.

Inductor's CPU code generation writes each fused kernel into the compiled module's source as a
call, ``async_compile.cpp_pybinding(argtypes, source)``, that only runs when the finished module
is loaded. Every C++ compile therefore starts after the last kernel is generated, and the
compile workers sit idle through the seconds of code generation before it (on a 2-core CPU the
whole step's 17 kernels then take 7-8 s more, after about 4 s of generation).

``kernels_built_as_generated`` makes the same call as each kernel's definition is written, so
its compile starts at once, on the worker the generating thread leaves free. The module's own
call later finds the build in inductor's in-memory cache (keyed by the source) and waits for
it instead of starting another. Only how soon a kernel is built changes: the source, the flags
and the compiled code are inductor's own.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

CALL = "async_compile.cpp_pybinding("
"""How a C++ kernel's definition starts in the code inductor generates."""


@contextlib.contextmanager
def kernels_built_as_generated() -> Iterator[None]:
    """Within this block, every C++ kernel inductor defines is submitted to its compile workers right away (when
    inductor compiles with workers; with ``compile_threads`` 1 nothing changes)."""
    from torch._inductor.async_compile import AsyncCompile, get_compile_threads
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen

    original = PythonWrapperCodegen.define_kernel
    if get_compile_threads() <= 1 or getattr(original, "builds_as_generated", False):
        yield  # no workers, or a block already open (here or in another thread), whose exit restores inductor's own
        return
    compiler = AsyncCompile()
    failures: list[BaseException] = []

    def define_kernel(self: Any, kernel_name: str, kernel_body: str, *args: Any, **kwargs: Any) -> Any:
        defined = original(self, kernel_name, kernel_body, *args, **kwargs)
        if kernel_body.startswith(CALL) and not failures:
            try:
                eval(_as_written(kernel_name, kernel_body), {"async_compile": compiler})  # inductor's own call
            except Exception as error:  # the module's own call compiles it then, as without this block
                failures.append(error)
        return defined

    define_kernel.builds_as_generated = True  # type: ignore[attr-defined]
    PythonWrapperCodegen.define_kernel = define_kernel  # type: ignore[method-assign]
    try:
        yield
    finally:
        PythonWrapperCodegen.define_kernel = original  # type: ignore[method-assign]
    if failures:
        warnings.warn(
            f"A C++ kernel could not be handed to the compile workers early ({failures[0]!r}); "
            "the kernels were compiled after code generation instead.",
            stacklevel=3,
        )


def _as_written(kernel_name: str, kernel_body: str) -> str:
    """The call as the generated module will make it: its definition goes through the same text buffer as the
    module's header (which drops the spaces of blank lines, and so changes the source and its cache key)."""
    from torch._inductor.utils import IndentedBuffer

    buffer = IndentedBuffer()
    buffer.splice(f"{kernel_name} = {kernel_body}")
    return buffer.getvalue().split(" = ", 1)[1]
