"""titanpod-pretrain: train a language model from a named recipe."""
