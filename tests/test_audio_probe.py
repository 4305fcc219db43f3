"""What an upload is, from its header alone (choir/plugins/audio.py's `probe`): soundfile's containers, FFmpeg's
through PyAV, and what neither reads."""

import io

import pytest

from choir.plugins.audio import probe
from tests.audio_files import encoded, wav


@pytest.mark.parametrize("make, container, seconds", [
    (lambda: wav(3), "WAV", 3.0),
    (lambda: encoded(2, "FLAC"), "FLAC", 2.0),
    (lambda: encoded(2, "OGG"), "OGG", 2.0),
])
def test_soundfiles_containers_say_their_length(make, container, seconds):
    found = probe(make())
    assert found.container == container and found.seconds == pytest.approx(seconds)


def test_ffmpegs_containers_are_read_through_pyav():
    found = probe(encoded(2, "M4A"))
    assert "mp4" in found.container and found.seconds == pytest.approx(2.0, abs=0.2)


def test_a_picture_holds_no_audio():
    from PIL import Image

    picture = io.BytesIO()
    Image.new("RGB", (8, 8)).save(picture, "PNG")
    with pytest.raises(ValueError, match="not audio|no audio stream"):
        probe(picture.getvalue())


@pytest.mark.parametrize("data", [b"", b"plain text", b"RIFF\0\0\0\0WAVEfmt garbage", bytes(4096)])
def test_what_no_reader_recognises_is_refused(data):
    with pytest.raises(ValueError):
        probe(data)
