"""titanpod-posttrain: not available yet."""
