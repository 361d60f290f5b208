"""Weight and activation quantization for module 09: int4 group-wise, int8, and quantized linear layers."""
