"""The calls titanpod's vLLM engine makes into vLLM, read from titanpod's source (never imported here).

titanpod pins torch 2.13 (and, for its tpu lane, torch_tpu with libtpu 0.0.52 and JAX 0.10); vLLM's TPU build
0.32.0 pins torchvision 0.25 (so torch 2.10), libtpu 0.0.48 and JAX 0.11.2, and needs Python 3.12. The two
cannot share an environment, so this environment holds vLLM's TPU build alone and reads what titanpod calls
from ``packages/rl/src/titanpod/rl/rollout/vllm_engine.py`` and ``vllm_worker.py`` with ``ast``, each time the
tests run: a call added to titanpod is checked without editing these tests.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
ROLLOUT = ROOT / "packages" / "rl" / "src" / "titanpod" / "rl" / "rollout"
ENGINE_SOURCE = ROLLOUT / "vllm_engine.py"
WORKER_SOURCE = ROLLOUT / "vllm_worker.py"

UNKNOWN = object()
"""A keyword's value that is not a constant in titanpod's source (a variable)."""


@dataclass
class Call:
    """One call in titanpod's source: keyword name -> its constant value (``UNKNOWN`` when not a constant),
    and its positional arguments' constants (``UNKNOWN`` likewise)."""

    line: int
    keywords: dict[str, Any] = field(default_factory=dict)
    positional: list[Any] = field(default_factory=list)


@dataclass
class EngineCalls:
    """What ``vllm_engine.py`` calls: the ``vllm.LLM`` constructor, ``vllm.SamplingParams``, the methods called
    on the ``LLM`` object, the attributes read off vLLM's outputs, the dtype names it may pass and the names it
    imports from vLLM."""

    llm: list[Call]
    sampling: list[Call]
    llm_methods: dict[str, list[Call]]
    output_reads: dict[str, set[str]]
    dtypes: list[str]
    vllm_imports: list[tuple[str, str]]
    platform_methods: set[str]
    refusal_line: int | None
    """Line of ``check_not_tpu_build()`` in ``VLLMEngine.__init__`` (``None`` when it is not called there)."""


@dataclass
class WorkerCalls:
    """What ``TitanpodWorkerExtension`` (mixed into each vLLM worker) needs from the worker it is mixed into."""

    methods: set[str]
    """The extension's own methods (vLLM refuses one that the worker class already has)."""
    worker_attrs: set[str]
    """Attributes it reads on ``self`` that it does not define: the worker's."""
    runner_attrs: set[str]
    """Attributes it reads on ``self.model_runner``."""
    reload_keywords: set[str]
    """Keywords it passes to ``self.reload_weights``."""
    model_methods: set[str]
    """Methods it calls on ``self.model_runner.model`` (the worker's model)."""


def _constants(tree: ast.Module) -> dict[str, Any]:
    """Module-level names bound to a constant or a dict with constant keys (the keys' list)."""
    found: dict[str, Any] = {}
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            target, value = node.target.id, node.value
        if isinstance(value, ast.Constant):
            found[target] = value.value
        elif isinstance(value, ast.Dict):
            found[target] = [key.value for key in value.keys if isinstance(key, ast.Constant)]
    return found


def _value(node: ast.expr, constants: dict[str, Any]) -> Any:
    """``node``'s constant value, through module constants; ``UNKNOWN`` otherwise."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in constants and not isinstance(constants[node.id], list):
        return constants[node.id]
    return UNKNOWN


def _dict_keys_bound_to(function: ast.FunctionDef, name: str) -> list[str]:
    """The constant keys of every dict literal assigned to ``name`` in ``function`` (a ``**name`` argument)."""
    keys = []
    for node in ast.walk(function):
        bound = isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
        if bound and isinstance(node.value, ast.Dict):
            keys += [key.value for key in node.value.keys if isinstance(key, ast.Constant)]
    return keys


def _call(node: ast.Call, constants: dict[str, Any], function: ast.FunctionDef | None) -> Call:
    call = Call(line=node.lineno, positional=[_value(arg, constants) for arg in node.args])
    for keyword in node.keywords:
        if keyword.arg is not None:
            call.keywords[keyword.arg] = _value(keyword.value, constants)
        elif isinstance(keyword.value, ast.Name) and function is not None:  # **memory: every dict bound to it
            for key in _dict_keys_bound_to(function, keyword.value.id):
                call.keywords[key] = UNKNOWN
        else:
            raise ValueError(f"line {node.lineno}: a ** argument this reader cannot follow; extend titanpod_calls.py")
    return call


def _is_self_attr(node: ast.expr, attr: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == attr
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _functions(tree: ast.AST) -> list[ast.FunctionDef]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise ValueError(f"titanpod's source has no class {name}; update envs/vllm_tpu/tests/titanpod_calls.py")


def engine_calls(source: Path = ENGINE_SOURCE) -> EngineCalls:
    """Every vLLM call of ``vllm_engine.py``, read from its source."""
    tree = ast.parse(source.read_text(), filename=str(source))
    constants = _constants(tree)
    llm, sampling, methods = [], [], {}
    reads: dict[str, set[str]] = {"request_output": set(), "completion_output": set(), "logprob": set()}
    platform_methods: set[str] = set()
    refusal_line = None
    llm_line = None
    for function in _functions(tree):
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                func = node.func
                if func.attr == "LLM" and isinstance(func.value, ast.Name) and func.value.id == "vllm":
                    llm.append(_call(node, constants, function))
                    if function.name == "__init__":
                        llm_line = node.lineno
                elif func.attr == "SamplingParams" and _is_self_attr(func.value, "_vllm"):
                    sampling.append(_call(node, constants, function))
                elif _is_self_attr(func.value, "llm"):
                    methods.setdefault(func.attr, []).append(_call(node, constants, function))
                elif isinstance(func.value, ast.Name) and func.value.id == "current_platform":
                    platform_methods.add(func.attr)
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "check_not_tpu_build"
                and function.name == "__init__"
            ):
                refusal_line = node.lineno
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                owner = {"output": "request_output", "choice": "completion_output"}.get(node.value.id)
                if owner is not None:
                    reads[owner].add(node.attr)
            if isinstance(node, ast.Attribute) and node.attr == "logprob" and isinstance(node.value, ast.Subscript):
                reads["logprob"].add("logprob")
    imports = [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vllm"
        for alias in node.names
    ]
    if refusal_line is not None and llm_line is not None and refusal_line > llm_line:
        refusal_line = None  # called only after vLLM started: no refusal
    return EngineCalls(
        llm=llm,
        sampling=sampling,
        llm_methods=methods,
        output_reads=reads,
        dtypes=list(constants.get("VLLM_DTYPES", [])),
        vllm_imports=imports,
        platform_methods=platform_methods,
        refusal_line=refusal_line,
    )


def worker_calls(source: Path = WORKER_SOURCE, name: str = "TitanpodWorkerExtension") -> WorkerCalls:
    """What the worker extension class ``name`` reads from the worker it is mixed into, from its source."""
    tree = ast.parse(source.read_text(), filename=str(source))
    cls = _class(tree, name)
    methods = {node.name for node in cls.body if isinstance(node, ast.FunctionDef)}
    defined = set(methods)
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else []
        defined |= {t.attr for t in targets if isinstance(t, ast.Attribute) and _is_self_attr(t, t.attr)}
    worker_attrs, runner_attrs, reload_keywords, model_methods = set(), set(), set(), set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            worker_attrs.add(node.attr)
        if isinstance(node, ast.Attribute) and _is_self_attr(node.value, "model_runner"):
            runner_attrs.add(node.attr)
        if isinstance(node, ast.Call) and _is_self_attr(node.func, "reload_weights"):
            reload_keywords |= {keyword.arg for keyword in node.keywords if keyword.arg}
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr == "model"
            and _is_self_attr(node.func.value.value, "model_runner")
        ):
            model_methods.add(node.func.attr)
    return WorkerCalls(
        methods=methods,
        worker_attrs=worker_attrs - defined,
        runner_attrs=runner_attrs,
        reload_keywords=reload_keywords,
        model_methods=model_methods,
    )
