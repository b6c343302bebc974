"""How the commands report a failure: one line on stderr that says what went wrong."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape


def print_error(error: BaseException) -> None:
    """Print ``error`` to stderr, unwrapped and with no markup read into its text."""
    text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    Console(stderr=True).print(f"[bold red]error:[/] {escape(str(text))}", soft_wrap=True)
