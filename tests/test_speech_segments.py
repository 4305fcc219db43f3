"""How a Whisper output's timestamp tokens become segments (verbose_json, srt, vtt): read with the tiny Whisper's
own tokenizer (models/choir-tiny-whisper), scripted token ids in place of a generation."""

import pytest

from choir.core.settings import BUNDLED_SPEECH_DIR
from choir.engine.vllm.speech import VllmSpeech

pytestmark = pytest.mark.skipif(not BUNDLED_SPEECH_DIR.is_dir(), reason="make install builds the tiny Whisper")


@pytest.fixture(scope="module")
def speech() -> VllmSpeech:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(BUNDLED_SPEECH_DIR))
    speech = object.__new__(VllmSpeech)  # the parts segments() reads, without an engine
    speech._tokenizer, speech._eos = tokenizer, tokenizer.eos_token_id
    speech._timestamp_begin = tokenizer.convert_tokens_to_ids("<|0.00|>")
    return speech


def ids(speech: VllmSpeech, *pieces: str) -> list[int]:
    """Text pieces as their tokens; `<|1.00|>` and the like as the timestamp's token."""
    out: list[int] = []
    for piece in pieces:
        if piece.startswith("<|"):
            out.append(speech._tokenizer.convert_tokens_to_ids(piece))
        else:
            out += speech._tokenizer.encode(piece, add_special_tokens=False)
    return out


def test_two_timestamps_in_a_row_end_one_segment_and_start_the_next(speech):
    tokens = ids(speech, " Hello world", "<|1.00|>", "<|1.00|>", " The fox", "<|2.50|>", "<|endoftext|>")
    found = speech.segments(tokens, [-0.5] * len(tokens), offset=5.0)
    assert [(s.start, s.end, s.text) for s in found] == [(5.0, 6.0, " Hello world"), (6.0, 7.5, " The fox")]
    first = found[0]
    assert first.tokens == ids(speech, " Hello world")
    # each segment's mean logprob over its text and its closing timestamp
    assert first.avg_logprob == pytest.approx(-0.5 * (len(first.tokens) + 1) / (len(first.tokens) + 2))
    assert first.compression_ratio > 0


def test_text_with_no_timestamp_after_it_is_no_segment(speech):
    assert speech.segments(ids(speech, " no timestamps at all"), [-1.0] * 4, offset=0.0) == []


def test_a_model_without_timestamps_has_no_segments(speech):
    plain = object.__new__(VllmSpeech)
    plain._tokenizer, plain._eos, plain._timestamp_begin = speech._tokenizer, speech._eos, None
    assert plain.segments(ids(speech, " a", "<|1.00|>"), [0.0, 0.0], 0.0) == []
