"""One module per lane; ``titanpod.device.get_backend`` imports only the one it returns."""
