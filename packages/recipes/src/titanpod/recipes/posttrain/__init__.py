"""titanpod.recipes.posttrain: post-training building blocks (GRPO rollouts and weight sync)."""
