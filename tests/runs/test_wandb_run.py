"""The run's W&B run: W&B's environment variables and the recipe's fields in their order (a field that is set, then
the environment, then the default), the run id kept for a resume, and a W&B that cannot start (no login)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.graph.wandb_records import history, offline_environment, wandb_records
from titanpod.recipes.recipe import OutputConfig
from titanpod.runs.wandb_run import (
    RUN_ID_FILE,
    WandbStartError,
    choose_wandb,
    open_wandb,
    read_run_id,
    wandb_mode,
    write_run_id,
)

RUN = Path("runs/try1")


def test_the_mode_field_wins_over_wandb_mode_which_wins_over_online():
    assert wandb_mode(None, {}) == "online"
    assert wandb_mode(None, {"WANDB_MODE": "offline"}) == "offline"
    assert wandb_mode("online", {"WANDB_MODE": "offline"}) == "online"
    assert wandb_mode("offline", {"WANDB_MODE": "online"}) == "offline"
    assert wandb_mode(None, {"WANDB_MODE": "dryrun"}) == "offline"  # W&B's older names
    assert wandb_mode(None, {"WANDB_MODE": "run"}) == "online"
    assert wandb_mode(None, {"WANDB_MODE": "Disabled"}) == "disabled"
    with pytest.raises(ValueError, match=r"WANDB_MODE='sideways' is not a W&B mode.*--output.wandb-mode"):
        wandb_mode(None, {"WANDB_MODE": "sideways"})


def test_wandb_mode_disabled_turns_wandb_off_unless_the_field_says_otherwise():
    assert choose_wandb(OutputConfig(wandb=None), RUN, {}, None) is None
    assert choose_wandb(OutputConfig(wandb="p"), RUN, {"WANDB_MODE": "disabled"}, None) is None
    chosen = choose_wandb(OutputConfig(wandb="p", wandb_mode="offline"), RUN, {"WANDB_MODE": "disabled"}, None)
    assert chosen is not None and chosen.mode == "offline"


def test_project_entity_name_and_folder_follow_the_field_then_the_environment_then_the_default():
    environ = {
        "WANDB_PROJECT": "env-project", "WANDB_ENTITY": "env-team", "WANDB_NAME": "env-name", "WANDB_DIR": "/tmp/w",
    }  # fmt: skip
    bare = choose_wandb(OutputConfig(wandb="auto"), RUN, {}, None)
    assert bare is not None
    assert (bare.project, bare.entity, bare.name, bare.folder, bare.mode) == ("titanpod", None, "try1", RUN, "online")
    from_env = choose_wandb(OutputConfig(wandb="auto"), RUN, environ, None)
    assert from_env is not None
    assert (from_env.project, from_env.entity, from_env.name) == ("env-project", "env-team", "env-name")
    assert from_env.folder == Path("/tmp/w")
    named = choose_wandb(OutputConfig(wandb="mine", wandb_entity="my-team"), RUN, environ, None)
    assert named is not None and (named.project, named.entity) == ("mine", "my-team")


def test_the_run_id_is_wandb_run_id_then_the_stored_one_then_a_new_one_and_the_run_is_resumable():
    output = OutputConfig(wandb="p")
    fresh = choose_wandb(output, RUN, {}, None)
    assert fresh is not None and fresh.id_source == "new" and fresh.resume == "allow"
    assert len(fresh.run_id) == 8 and fresh.run_id.isalnum() and fresh.run_id == fresh.run_id.lower()
    stored = choose_wandb(output, RUN, {}, "abc123")
    assert stored is not None and (stored.run_id, stored.id_source) == ("abc123", "stored")
    forced = choose_wandb(output, RUN, {"WANDB_RUN_ID": "given1", "WANDB_RESUME": "must"}, "abc123")
    assert forced is not None and (forced.run_id, forced.id_source, forced.resume) == ("given1", "WANDB_RUN_ID", "must")


def test_the_run_id_file_round_trips(tmp_path):
    assert read_run_id(tmp_path) is None
    write_run_id(tmp_path, "abc123")
    assert read_run_id(tmp_path) == "abc123"
    assert [path.name for path in tmp_path.iterdir()] == [RUN_ID_FILE]  # nothing left beside it


def test_offline_by_wandb_mode_keeps_the_run_and_a_resume_continues_its_id(
    tmp_path, monkeypatch, clean_wandb_environment
):
    for name, value in offline_environment(tmp_path).items():  # WANDB_MODE=offline: the field is left unset
        monkeypatch.setenv(name, value)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    said: list[str] = []
    output = OutputConfig(wandb="titanpod-test")
    first = open_wandb(output, run_dir, {"train": {"steps": 2}}, said.append)
    assert first is not None
    first.write_scalars(2, {"validation_loss": 3.0})
    first.close()
    run_id = read_run_id(run_dir)
    assert run_id == first.run_id
    assert first.run_dir.parent == run_dir / "wandb" and first.run_dir.name.startswith("offline-run-")
    assert said[-1].startswith(f"W&B: starts offline run {run_id} in titanpod-test")

    second = open_wandb(output, run_dir, {"train": {"steps": 4}}, said.append)  # the run resumed
    assert second is not None and second.run_id == run_id
    second.write_scalars(4, {"validation_loss": 2.0})
    second.close()
    assert said[-1].startswith(f"W&B: continues offline run {run_id}")
    folders = (run_dir / "wandb").glob("offline-run-*")
    assert {folder.name.rsplit("-", 1)[1] for folder in folders} == {run_id}  # W&B gives each start a folder
    assert history(wandb_records(second.run_dir / f"run-{run_id}.wandb"))[4]["eval/validation_loss"] == 2.0


def test_without_a_login_the_run_goes_on_without_wandb_and_says_how_to_fix_it(tmp_path, not_logged_in):
    said: list[str] = []
    assert open_wandb(OutputConfig(wandb="p"), tmp_path, {}, said.append) is None
    [line] = said
    assert "W&B could not start the online run" in line and "wandb login" in line
    assert "WANDB_MODE=offline" in line and "Training goes on without W&B" in line
    assert read_run_id(tmp_path) is None


def test_without_a_login_a_required_wandb_stops(tmp_path, not_logged_in):
    with pytest.raises(WandbStartError, match=r"wandb login.*--output.wandb-required is on"):
        open_wandb(OutputConfig(wandb="p", wandb_required=True), tmp_path, {}, print)
    assert read_run_id(tmp_path) is None


def test_without_the_wandb_package_the_run_stops_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now fails as when it is not installed
    with pytest.raises(WandbStartError, match=r"pip install 'titanpod-graph\[wandb\]'"):
        open_wandb(OutputConfig(wandb="p", wandb_mode="offline"), tmp_path, {}, print)
    assert read_run_id(tmp_path) is None


@pytest.mark.slow  # starts W&B's service process, which waits for the server it cannot reach
def test_without_the_network_the_run_goes_on_without_wandb(tmp_path, monkeypatch, not_logged_in):
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)  # logged in, but the server does not answer
    said: list[str] = []
    assert open_wandb(OutputConfig(wandb="p"), tmp_path, {}, said.append) is None
    assert "W&B could not start the online run" in said[-1] and "WANDB_MODE=offline" in said[-1]
    assert read_run_id(tmp_path) is None
