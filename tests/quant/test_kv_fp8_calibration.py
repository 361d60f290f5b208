"""fp8 KV calibration reads the text it is handed (quant imports no training code); the engine hands it
the training corpus, so its scales are that text's amax rule and no other."""

from __future__ import annotations

import pytest
import torch

from course_lib.engine.llm import LLM
from course_lib.models.corpus import corpus
from course_lib.quant.kv_fp8 import CALIBRATION_TOKENS, calibrate_kv_scales


def test_the_scales_come_from_the_text_passed_in(tiny):
    train = corpus()[0]
    one_byte = torch.full((4 * CALIBRATION_TOKENS,), ord("x"))
    from_corpus = calibrate_kv_scales(tiny, train)
    assert calibrate_kv_scales(tiny, train.clone()) == from_corpus  # deterministic in the text
    assert calibrate_kv_scales(tiny, one_byte) != from_corpus
    assert all(layer.self_attn.kv_scales is None for layer in tiny.model.layers)  # calibration leaves no trace


def test_text_that_is_not_one_long_enough_stream_is_refused(tiny):
    with pytest.raises(ValueError, match="text must be one token stream of at least 256 ids"):
        calibrate_kv_scales(tiny, torch.zeros(CALIBRATION_TOKENS - 1, dtype=torch.long))
    with pytest.raises(ValueError, match="a 1-D tensor"):
        calibrate_kv_scales(tiny, corpus()[0][:4 * CALIBRATION_TOKENS].view(4, -1))


def test_the_engine_calibrates_on_the_training_corpus(tiny):
    llm = LLM(tiny, max_model_len=256, kv_cache_dtype="fp8", num_gpu_blocks=16)
    assert llm.kv_scales == calibrate_kv_scales(tiny, corpus()[0])
