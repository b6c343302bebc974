"""titanpod-posttrain: supervised fine-tuning (and reinforcement learning) of a language model from a recipe."""
