"""titanpod's worker extension against tpu-inference's TPU worker and model runner: what it needs and what they have.

titanpod's weight sync calls the worker's ``reload_weights`` (vLLM's in-place reload) and reads the weights
back from ``self.model_runner.model``'s torch parameters. tpu-inference 0.32.0's worker has no
``reload_weights`` and its runner holds the weights as JAX arrays, so titanpod refuses this build before vLLM
starts; these tests show both halves, and fail when tpu-inference gains the method (time to lift the refusal).
"""

from __future__ import annotations

import ast
import inspect
import textwrap

from titanpod_calls import engine_calls, worker_calls

WORKER = worker_calls()


def instance_attributes(cls: type, method: str) -> set[str]:
    """The ``self.X = ...`` attributes ``cls.method`` assigns (read from the installed source)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(cls, method))))
    return {
        target.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
    }


def test_the_tpu_platform_runs_tpu_inferences_worker(tpu_worker):
    from tpu_inference.platforms.tpu_platform import TpuPlatform
    from vllm.v1.worker.worker_base import WorkerBase

    assert issubclass(tpu_worker, WorkerBase)
    source = inspect.getsource(TpuPlatform.check_and_update_config)
    assert f'"{tpu_worker.__module__}.{tpu_worker.__qualname__}"' in source  # parallel_config.worker_cls


def test_the_extension_mixes_into_the_tpu_worker_without_a_clash(tpu_worker):
    # vLLM refuses an extension whose attribute the worker class already has (WorkerWrapperBase.init_worker)
    assert WORKER.methods == {"titanpod_load_weights", "titanpod_checksum"}
    assert not [name for name in WORKER.methods if hasattr(tpu_worker, name)]


def test_the_tpu_worker_has_no_in_place_reload(tpu_worker):
    has = set(dir(tpu_worker)) | instance_attributes(tpu_worker, "init_device")
    missing = WORKER.worker_attrs - has
    assert WORKER.reload_keywords == {"weights_iterator"}
    assert missing == {"reload_weights"}, f"tpu-inference's TPUWorker lacks {sorted(missing)}"
    # what it offers instead: weights written into the runner's JAX state out of band
    assert {"update_weights", "get_weights_state"} <= has


def test_the_tpu_model_runner_has_no_reload_and_holds_jax_state():
    from tpu_inference.runner.tpu_runner import TPUModelRunner

    has = set(dir(TPUModelRunner)) | instance_attributes(TPUModelRunner, "load_model")
    assert WORKER.runner_attrs - has == {"reload_weights"}
    assert {"state", "model"} <= has
    assert "refresh_state_leaves" in has  # rebinding its JAX weights needs this; torch parameters are not used


def test_titanpod_refuses_this_build_before_vllm_starts(vllm):
    from vllm.platforms import current_platform

    assert current_platform.is_tpu(), f"vllm-tpu's platform here is {type(current_platform).__name__}"
    assert engine_calls().refusal_line is not None, "VLLMEngine.__init__ must call check_not_tpu_build() first"
