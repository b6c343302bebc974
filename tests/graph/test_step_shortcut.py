"""A cached whole step loaded without its capture: the step's fingerprint, the shortcut beside the artifact,
and the remembered check of the CPU's vector instructions.

A run that loads through the shortcut executes the same compiled code as the run that compiled
it, so losses and parameters must be equal exactly; the fingerprint must be the same in every
process and before or after a capture, and must change with whatever changes the captured graph.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from tests.conftest import run_json_script
from titanpod.device import get_backend
from titanpod.graph import TrainConfig, WholeStep, steps
from titanpod.graph.cpu_compile import CachedStepCompiler, vector_isa
from titanpod.graph.cpu_compile.compiled_steps import load_shortcut
from titanpod.models import DecoderArgs, Transformer

TINY = DecoderArgs(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=64, ffn_dim=64, max_seq_len=32)
BACKEND = get_backend("cpu")


def whole_step(cache: str, args: DecoderArgs = TINY, **changes) -> WholeStep:
    model = Transformer(args)
    model.init_weights(0)
    config = TrainConfig(
        warmup_steps=0, step_mode="whole_step", step_compiler="cached", compile_cache_dir=cache, **changes
    )
    return WholeStep(model, config, BACKEND)


def compiler(step: WholeStep) -> CachedStepCompiler:
    assert isinstance(step._compiler, CachedStepCompiler)
    return step._compiler


def batches(count: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    tokens = [torch.randint(0, 64, (2, 17), generator=generator) for _ in range(count)]
    return [(row[:, :-1], row[:, 1:]) for row in tokens]


def train_steps(step: WholeStep) -> list[float]:
    return [float(step([batch], 1e-3).loss) for batch in batches()]


def fingerprint(step: WholeStep) -> str:
    tokens, labels = batches(1)[0]
    return compiler(step).fingerprint(step._inputs(tokens[None], labels[None], step.lr_tensor(0.0)))


def test_a_later_run_loads_the_step_without_capturing_it_and_trains_the_same(tmp_path):
    first = whole_step(str(tmp_path))
    assert not compiler(first).shortcut_possible()  # nothing checked on this machine yet: capture while the check runs
    first_losses = train_steps(first)
    assert first.compile_report is not None and first.compile_report.cache == "miss"
    assert len(list(tmp_path.glob("*.shortcut.json"))) == 1

    second = whole_step(str(tmp_path))
    assert compiler(second).shortcut_possible()
    second_losses = train_steps(second)
    assert second.compile_report is not None and second.compile_report.cache == "hit"
    assert second._graph is None, "the step was captured although its shortcut was there"
    assert second_losses == first_losses
    for a, b in zip(first.model.parameters(), second.model.parameters(), strict=True):
        assert torch.equal(a, b)
    graph = second.graph  # captured when read
    assert graph is not None and second.graph is graph
    assert sum(node.op == "placeholder" for node in graph.graph.nodes) == len(torch.utils._pytree.tree_leaves(
        second._inputs(*[t[None] for t in batches(1)[0]], second.lr_tensor(0.0))
    ))  # fmt: skip


def test_without_the_cache_the_step_is_captured_and_no_shortcut_is_kept(tmp_path):
    step = whole_step("off")
    train_steps(step)
    assert step.compile_report is not None and step.compile_report.cache == "off"
    assert step._graph is not None


def test_the_fingerprint_is_the_same_in_another_process_and_after_a_capture(tmp_path):
    step = whole_step(str(tmp_path))
    before = fingerprint(step)
    tokens, labels = batches(1)[0]
    step.prepare(tokens[None], labels[None])
    assert fingerprint(step) == before
    script = f"""
import json
from tests.graph.test_step_shortcut import fingerprint, whole_step
print(json.dumps({{"fingerprint": fingerprint(whole_step({str(tmp_path)!r}))}}))
"""
    assert run_json_script(script)["fingerprint"] == before


def test_the_fingerprint_follows_the_config_the_model_and_the_functions_that_build_the_step(monkeypatch):
    reference = fingerprint(whole_step("default"))
    assert fingerprint(whole_step("default")) == reference
    assert fingerprint(whole_step("default", grad_clip=0.5)) != reference
    assert fingerprint(whole_step("default", memory_policy="recompute")) != reference
    assert fingerprint(whole_step("default", args=replace(TINY, ffn_dim=96))) != reference
    monkeypatch.setattr(steps, "fold_constants", lambda graph: [])
    assert fingerprint(whole_step("default")) != reference


def test_a_shortcut_that_cannot_serve_is_passed_over(tmp_path):
    step = whole_step(str(tmp_path))
    train_steps(step)
    record_path = next(tmp_path.glob("*.shortcut.json"))
    key = record_path.name.removesuffix(".shortcut.json")
    record = json.loads(record_path.read_text())
    assert load_shortcut(tmp_path, key) is not None

    record_path.write_text(json.dumps({**record, "ops": [*record["ops"], "nowhere::kernel.default"]}))
    assert load_shortcut(tmp_path, key) is None  # an op its capture would have registered: capture instead
    record_path.write_text(json.dumps({**record, "artifact": "gone.bin"}))
    assert load_shortcut(tmp_path, key) is None
    record_path.write_text("{not json")
    with pytest.warns(UserWarning, match="could not be read"):
        assert load_shortcut(tmp_path, key) is None


def test_the_vector_isa_check_is_remembered_and_a_record_that_disagrees_is_checked_again(tmp_path):
    from torch._inductor.cpu_vec_isa import pick_vec_isa, valid_vec_isa_list

    real = str(pick_vec_isa())
    checked = [str(isa) for isa in valid_vec_isa_list()]
    told: list[bool] = []
    assert vector_isa.pick(tmp_path, told.append) == real
    record = json.loads((tmp_path / vector_isa.RECORD).read_text())
    assert list(record.values()) == [checked]
    assert vector_isa.pick(tmp_path, told.append) == real  # from the CPU's flags, matching the record
    assert told == [True, False]

    (machine,) = record
    disagreeing = ["avx512"] if checked == ["avx2"] else ["avx2"]  # whatever this machine's list is
    (tmp_path / vector_isa.RECORD).write_text(json.dumps({machine: disagreeing}))
    assert vector_isa.pick(tmp_path, told.append) == real
    assert told[-1] is True
    assert json.loads((tmp_path / vector_isa.RECORD).read_text()) == {machine: checked}
    assert vector_isa.VectorIsaProbe(tmp_path).result() == real
    assert vector_isa.VectorIsaProbe(None).result() == real


def test_a_vector_isa_setting_of_the_users_is_left_to_inductor(tmp_path):
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    told: list[bool] = []
    with config.patch({"cpp.vec_isa_ok": False}):
        assert vector_isa.pick(tmp_path, told.append) == str(pick_vec_isa())
    assert told == [False]
    assert not (tmp_path / vector_isa.RECORD).exists()
