"""``titanpod-diffusion``: diffusion-transformer (FLUX.1) training. Not available yet."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Say plainly that this app is not available yet, and exit with status 2."""
    print(
        "titanpod-diffusion is not available yet: FLUX.1 training has not landed. "
        "Use titanpod-pretrain for language models.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
