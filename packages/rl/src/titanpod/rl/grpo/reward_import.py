"""A user's reward function named by import path (``module:function`` or ``path/to/file.py:function``), checked
on a real row before any training work.

The function is called as ``function(prompt, completion, row)``: the prompt text, the completion text and
the prompt's whole row (a dict of its columns; ``{"prompt", "answer"}`` for a built-in task) and must
return a number (``bool`` counts as 0 or 1).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import numbers
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from titanpod.data.tasks import Example
from titanpod.rl.grpo.reward_call import RewardExit, RewardTimeout, call_with_timeout, failure_message

FINITE_FIX = (
    "Fix the function to return a finite float for every completion (e.g. 0.0 for a wrong one, 1.0 for a right "
    "one), never NaN or infinity, and scale large scores down."
)
"""What to do about a reward function that returns NaN, infinity or a number beyond ``REWARD_LIMIT``."""
REWARD_LIMIT = 1e6
"""The largest reward size a run accepts. Rewards are scores, most often between 0 and 1: one far beyond this is
a bug (a sentinel value, a count, an overflow), and sizes near the float limit overflow a group's mean and spread
into NaN, so every update would be skipped while the run went on."""
FIX = "write it as module:function (a module importable from the current directory or PYTHONPATH) or file.py:function"


@dataclass(frozen=True)
class RowReward:
    """A reward called with the prompt, the completion text and the prompt's row; returns a number."""

    function: Callable[[str, str, Mapping[str, Any]], Any]
    """The user's function."""
    name: str
    """The import path it was named by, for messages."""

    def score(self, example: Example, completion: str) -> float:
        """The function's value on ``example``'s prompt and row and ``completion``; ``TypeError`` when it is not a
        number."""
        value = self.function(example.prompt, completion, dict(example.fields()))
        return reward_number(value, f"the reward function {self.name}")


def reward_number(value: Any, name: str) -> float:
    """``value`` as a float when it is a number (``bool``, NumPy and 0-d tensor values included), else
    ``TypeError`` naming ``name``."""
    if not isinstance(value, numbers.Real) and (isinstance(value, (str, bytes)) or not hasattr(value, "__float__")):
        raise TypeError(
            f"{name or 'the reward function'} returned {type(value).__name__} {value!r}, not a number: return a float "
            "(e.g. 1.0 for a right completion, 0.0 for a wrong one)"
        )
    return float(value)


def usable_reward(value: float) -> bool:
    """Whether a run can train on the reward ``value``: finite and no larger than ``REWARD_LIMIT`` in size."""
    return math.isfinite(value) and abs(value) <= REWARD_LIMIT


def unusable_reward_message(value: float, name: str, where: str) -> str:
    """Why the reward ``value`` that the function ``name`` returned on the sample ``where`` describes cannot be
    trained on, with the fix."""
    return (
        f"the reward function {name} returned {value} {where}: a reward must be a finite number no larger than "
        f"{REWARD_LIMIT:g} in size, and a run does not train on one that is not. {FINITE_FIX}"
    )


def load_module(module_name: str, spec: str) -> Any:
    """The module ``module_name`` (a dotted name, or a ``.py`` file path); ``ValueError`` when it cannot be loaded."""
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise ValueError(f"grpo.reward_function {spec!r}: no such file {module_name!r}; check the path, or {FIX}.")
        file_spec = importlib.util.spec_from_file_location(path.stem, path)
        if file_spec is None or file_spec.loader is None:
            raise ValueError(f"grpo.reward_function {spec!r}: {module_name!r} cannot be loaded as Python; {FIX}.")
        module = importlib.util.module_from_spec(file_spec)
        file_spec.loader.exec_module(module)
        return module
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # the user's module beside where they run, as `python -m` finds it
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise ValueError(
            f"grpo.reward_function {spec!r}: cannot import the module {module_name!r} ({error}); {FIX}."
        ) from error


def import_reward(spec: str) -> RowReward:
    """The function ``spec`` names; ``ValueError`` for a path without ``:``, a module that cannot be imported, a
    missing attribute or one that is not a function of three arguments."""
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise ValueError(f"grpo.reward_function {spec!r} is not an import path: {FIX}, e.g. my_rewards:score.")
    module = load_module(module_name, spec)
    function = getattr(module, attribute, None)
    if function is None:
        public = sorted(name for name, value in vars(module).items() if callable(value) and not name.startswith("_"))
        raise ValueError(
            f"grpo.reward_function {spec!r}: the module {module_name!r} has no {attribute!r} (its functions: "
            f"{', '.join(public) or 'none'}); name one of them."
        )
    if not callable(function):
        raise ValueError(
            f"grpo.reward_function {spec!r}: {attribute!r} is not a function (it is {type(function).__name__}): "
            "name a function."
        )
    try:
        inspect.signature(function).bind("prompt", "completion", {})
    except TypeError as error:
        raise ValueError(
            f"grpo.reward_function {spec!r} cannot be called as {attribute}(prompt, completion, row) ({error}): give "
            "it those three parameters."
        ) from error
    except ValueError:  # a builtin without a signature: the check on a row below still calls it
        pass
    return RowReward(function, spec)


def check_reward(reward: RowReward, example: Example, timeout_s: float | None = None) -> None:
    """Call ``reward`` on ``example`` with its reference answer as the completion, waiting at most ``timeout_s``
    seconds; ``ValueError`` saying what went wrong when it raises, calls ``sys.exit``, does not return in time,
    returns something that is not a number, or returns one a run cannot train on (NaN, infinity, beyond
    ``REWARD_LIMIT``), before any training work."""
    where = f"on the first training prompt {example.prompt!r} (with its answer {example.answer!r} as the completion)"
    try:
        value = call_with_timeout(partial(reward.score, example, example.answer), timeout_s, reward.name)
    except (RewardTimeout, RewardExit) as error:
        message = failure_message(error, reward.name, where)
        raise ValueError(message[0].upper() + message[1:]) from error
    except Exception as error:  # the user's code may raise anything: say so with the row it raised on
        raise ValueError(
            f"The reward function {reward.name} failed {where}: {type(error).__name__}: {error}. Fix the function; "
            "it is called as function(prompt, completion, row)."
        ) from error
    if not usable_reward(value):
        message = unusable_reward_message(value, reward.name, where)
        raise ValueError(message[0].upper() + message[1:])
