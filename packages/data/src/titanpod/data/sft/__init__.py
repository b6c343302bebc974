"""Chat and prompt/response data for supervised fine-tuning: its config, tokenizer and packed batches."""
