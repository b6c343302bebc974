"""titanpod.rl: post-training with rollouts: engines, verified weight sync, rewards and the GRPO objective."""
