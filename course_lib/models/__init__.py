"""Models the engine serves: a Llama-style decoder, its byte tokenizer, training and loading."""
