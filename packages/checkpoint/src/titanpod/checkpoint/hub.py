"""Pull checkpoints from the Hugging Face Hub and push them back, through huggingface_hub.

With ``HF_HUB_OFFLINE=1`` a pull is answered from the local cache alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from titanpod.checkpoint.companion_files import COMPANION_FILES
from titanpod.checkpoint.hf_folder import CONFIG_FILE
from titanpod.checkpoint.hub_errors import is_connection_error, repo_url, unreachable_error
from titanpod.checkpoint.model_card import CARD_FILE
from titanpod.checkpoint.safetensors_io import TRANSFORMERS_FILES, read_index

CHECKPOINT_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.jinja", "merges.txt"]
"""Files a pull fetches: configs, index, shards and tokenizer files; never pickles."""


def pull(repo_id: str, revision: str | None = None, cache_dir: Path | str | None = None) -> Path:
    """Download (or find in the cache) a model repository's checkpoint files; return the snapshot folder."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(
            repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=CHECKPOINT_PATTERNS, repo_type="model"
        )
    except LocalEntryNotFoundError as error:
        raise FileNotFoundError(
            f"{repo_id} is not in the local Hugging Face cache and the Hub cannot be reached "
            f"(offline, or HF_HUB_OFFLINE=1). Download it where the Hub is reachable, or pass a local folder. "
            f"({error})"
        ) from error
    return Path(folder)


def resolve_source(source: str, revision: str | None = None, cache_dir: Path | str | None = None) -> Path:
    """A local checkpoint folder as is, or a Hub id (``org/name``) pulled into the cache."""
    path = Path(source)
    if path.exists():
        if not path.is_dir():
            raise NotADirectoryError(f"{source} is a file; give the checkpoint folder.")
        return path
    if source.count("/") != 1 or source.startswith(("/", ".")):
        raise FileNotFoundError(f"{source} is neither a local folder nor a Hub id like 'org/name'.")
    return pull(source, revision, cache_dir)


class HubApi(Protocol):
    """The part of ``huggingface_hub.HfApi`` a push uses."""

    def create_repo(self, repo_id: str, *, private: bool | None, exist_ok: bool, repo_type: str) -> Any: ...

    def create_branch(self, repo_id: str, *, branch: str, exist_ok: bool, repo_type: str) -> Any: ...

    def upload_folder(
        self,
        *,
        repo_id: str,
        folder_path: str,
        commit_message: str,
        repo_type: str,
        revision: str | None,
        create_pr: bool,
    ) -> Any: ...


def check_checkpoint_folder(folder: Path) -> list[str]:
    """The files of a complete Hugging Face checkpoint folder (config, weights, then the tokenizer, generation
    and model card files it has); ``FileNotFoundError`` names what is missing."""
    folder = Path(folder)
    extras = [name for name in (*COMPANION_FILES, CARD_FILE) if (folder / name).is_file()]
    return [*_weight_files(folder), *extras]


def _weight_files(folder: Path) -> list[str]:
    folder = Path(folder)
    if not (folder / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{folder} has no {CONFIG_FILE}; export the checkpoint first.")
    if (folder / TRANSFORMERS_FILES.index).is_file():
        shards = sorted(read_index(folder / TRANSFORMERS_FILES.index))
        missing = [shard for shard in shards if not (folder / shard).is_file()]
        if missing:
            raise FileNotFoundError(f"{folder} lacks shards listed in its index: {', '.join(missing)}.")
        return [CONFIG_FILE, TRANSFORMERS_FILES.index, *shards]
    if (folder / TRANSFORMERS_FILES.single).is_file():
        return [CONFIG_FILE, TRANSFORMERS_FILES.single]
    raise FileNotFoundError(f"{folder} has no {TRANSFORMERS_FILES.single} or {TRANSFORMERS_FILES.index}.")


def push(
    folder: Path | str,
    repo_id: str,
    *,
    private: bool = True,
    commit_message: str = "Upload from titanpod",
    revision: str | None = None,
    create_pr: bool = False,
    api: HubApi | None = None,
    token: str | None = None,
) -> list[str]:
    """Check ``folder`` is a complete checkpoint, create ``repo_id`` if needed (``private`` or public) and upload
    the whole folder, model card included, as one commit titled ``commit_message``.

    ``revision`` names the branch to commit to (created from the main branch when missing); with ``create_pr``
    the upload opens a pull request (against ``revision``, or the main branch) instead of committing. Returns
    the checkpoint files uploaded. ``api`` defaults to ``huggingface_hub.HfApi(token=token)``. When the Hub cannot
    be reached, a ``HubUnreachableError`` names the repository URL and what to do.
    """
    files = check_checkpoint_folder(Path(folder))
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if revision is not None and not create_pr:
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
        api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            commit_message=commit_message,
            repo_type="model",
            revision=revision,
            create_pr=create_pr,
        )
    except Exception as error:
        if not is_connection_error(error):
            raise
        raise unreachable_error(error, f"push {folder} to", repo_url(api, repo_id)) from error
    return files
