"""Pure cost models and presets: hardware, model shapes, KV-cache sizing. No torch needed."""
