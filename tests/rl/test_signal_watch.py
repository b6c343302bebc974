"""The warning a GRPO run gives when every group has been flat for several steps in a row."""

from types import SimpleNamespace

from titanpod.rl.grpo.signal_watch import SignalWatch, no_signal_advice


def step(number: int, flat: int, accuracy: float = 0.5, reward: float = 0.5) -> SimpleNamespace:
    return SimpleNamespace(step=number, zero_signal_groups=flat, accuracy=accuracy, reward_mean=reward)


def test_it_warns_once_after_three_steps_in_a_row_with_every_group_flat():
    watch = SignalWatch(prompts_per_step=4)
    said = [watch.see(step(n, flat)) for n, flat in enumerate([4, 4, 3, 4, 4, 4, 4, 4], start=1)]
    assert said[:5] == [None] * 5  # step 3 had one group with signal: the count starts again
    assert said[5] is not None and said[5].startswith("step 6: every group of the last 3 steps")
    assert said[6:] == [None, None]


def test_partly_flat_steps_never_warn():
    watch = SignalWatch(prompts_per_step=4)
    assert all(watch.see(step(n, 3)) is None for n in range(1, 20))


def test_the_advice_follows_the_reward():
    assert "solved" in no_signal_advice(accuracy=1.0, reward_mean=1.0)
    assert "too hard" in no_signal_advice(accuracy=0.0, reward_mean=0.0)
    collapsed = no_signal_advice(accuracy=0.25, reward_mean=0.25)
    assert "collapsed" in collapsed and "--train.lr" in collapsed and "--grpo.kl-beta" in collapsed
    assert "collapsed" in no_signal_advice(accuracy=0.0, reward_mean=-1.0)  # a user reward of -1 everywhere
