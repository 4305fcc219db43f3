"""Audio files made here for the tests: a tone as WAV (the standard library's `wave`), FLAC or OGG (soundfile), or
AAC in MP4 (PyAV)."""

import io
import math
import struct
import wave


def samples(seconds: float, rate: int = 16000, hz: float = 440.0) -> list[float]:
    return [0.25 * math.sin(2 * math.pi * hz * i / rate) for i in range(int(seconds * rate))]


def wav(seconds: float, rate: int = 16000) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(b"".join(struct.pack("<h", int(32767 * s)) for s in samples(seconds, rate)))
    return buffer.getvalue()


def encoded(seconds: float, container: str) -> bytes:
    """FLAC and OGG through soundfile; M4A (AAC in MP4) through PyAV."""
    import numpy as np
    import soundfile

    data = np.array(samples(seconds), dtype=np.float32)
    buffer = io.BytesIO()
    if container in ("FLAC", "OGG"):
        soundfile.write(buffer, data, 16000, format=container)
        return buffer.getvalue()
    import av

    with av.open(buffer, "w", format="mp4") as out:
        stream = out.add_stream("aac", rate=16000, layout="mono")
        frame = av.AudioFrame.from_ndarray(data.reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate = 16000
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()
