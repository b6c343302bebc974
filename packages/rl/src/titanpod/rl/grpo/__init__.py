"""GRPO: the group-relative objective run by the graph step, with rollouts from an engine that holds its own weights."""
