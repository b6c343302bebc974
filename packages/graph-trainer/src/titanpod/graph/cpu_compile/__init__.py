"""titanpod's cached compile of the whole step for the lanes inductor compiles for (``train.step_compiler='cached'``).

The captured step goes to inductor directly and is kept in the compiled-step cache with a shortcut under
the step's fingerprint, so a later run of the same recipe loads it without capturing it
(``compiled_steps``, ``step_fingerprint``); on the CPU its C++ kernels are built as inductor generates them
(``early_kernel_builds``) and the check of the CPU's vector instructions overlaps the capture
(``vector_isa``). Several of these reach into inductor internals, so the compiler refuses a torch release
it has not been checked against (``torch_release``).
"""

from titanpod.graph.cpu_compile.cached_compiler import CachedStepCompiler
from titanpod.graph.cpu_compile.torch_release import CHECKED_TORCH_RELEASES, check_torch_release

__all__ = ["CHECKED_TORCH_RELEASES", "CachedStepCompiler", "check_torch_release"]
