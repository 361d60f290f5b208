"""What a paged KV cache is to everyone who touches it: the model's layers, the engine's attention
backends, the Triton kernels and fp8 calibration. Below all of them, and it imports none of them."""
