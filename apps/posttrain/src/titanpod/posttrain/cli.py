"""``titanpod-posttrain``: supervised fine-tuning and GRPO. Not available yet."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Say plainly that this app is not available yet, and exit with status 2."""
    print(
        "titanpod-posttrain is not available yet: SFT and GRPO have not landed. "
        "Use titanpod-pretrain for language models.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
