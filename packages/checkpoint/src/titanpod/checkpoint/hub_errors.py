"""The Hub out of reach, as a message: which repository, at which URL, and what to do."""

from __future__ import annotations

import socket
from typing import Any

CONNECTION_ERROR_NAMES = frozenset({"TransportError", "ConnectionError", "OfflineModeIsEnabled", "TimeoutException"})
"""Exception classes (by name, anywhere in an error's class hierarchy) that mean no connection: the HTTP
client's transport errors (httpx's ``ConnectError``/``TimeoutException``, requests' ``ConnectionError``) and
huggingface_hub's ``OfflineModeIsEnabled``, whichever HTTP library the installed huggingface_hub uses."""

DEFAULT_ENDPOINT = "https://huggingface.co"
"""The Hub's address when the client does not say (``HF_ENDPOINT`` changes it)."""


class HubUnreachableError(ConnectionError):
    """The Hugging Face Hub could not be reached: names the repository URL and what to do."""


def is_connection_error(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is a failure to reach the server at all."""
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, (ConnectionError, TimeoutError, socket.gaierror)):
            return True
        if any(kind.__name__ in CONNECTION_ERROR_NAMES for kind in type(seen).__mro__):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def repo_url(api: Any, repo_id: str) -> str:
    """The web address of model repository ``repo_id`` on the Hub ``api`` talks to."""
    endpoint = getattr(api, "endpoint", None)
    if not isinstance(endpoint, str):
        try:
            from huggingface_hub import constants

            endpoint = constants.ENDPOINT
        except ImportError:
            endpoint = DEFAULT_ENDPOINT
    return f"{endpoint.rstrip('/')}/{repo_id}"


def unreachable_error(error: BaseException, doing: str, url: str) -> HubUnreachableError:
    """The error to raise when ``doing`` (e.g. ``push runs/x/hf to``) ``url`` found no connection."""
    text = str(error).strip().splitlines()
    cause = f"{type(error).__name__}: {text[0] if text else '(no message)'}"
    return HubUnreachableError(
        f"The Hugging Face Hub could not be reached to {doing} {url} ({cause}). Check the network connection "
        "(and a proxy, if you need one), that HF_HUB_OFFLINE is not set and HF_ENDPOINT is right, then run the "
        "same command again (repeating an upload that was cut short is safe)."
    )
