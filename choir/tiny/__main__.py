"""`choir-tiny-models [--out DIR]`: the bundled tiny model and, beside it, its LoRA adapter, the pooling models and
the vision-language model and the speech-to-text model (`<out>-lora`, `<out>-embed`, `<out>-rerank`,
`<out>-classify`, `<out>-vlm`, `<out>-whisper`), the audio-language model (`<out>-audio`) and the streaming
speech model (`<out>-realtime`). Each is kept when already built by this version of its builder."""

import argparse
from pathlib import Path

from choir.tiny import audio_lm, extras, realtime, speech, text, vlm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="choir-tiny-models", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=text.DEFAULT_DIR, help=f"default: {text.DEFAULT_DIR}")
    parser.add_argument("--force", action="store_true", help="rebuild even if complete")
    args = parser.parse_args(argv)
    model, force = args.out, args.force

    def beside(suffix: str) -> Path:
        return model.with_name(f"{model.name}-{suffix}")

    for target, version, make in (
            (model, text.BUILDER_VERSION, lambda: text.build(model, force=force)),
            (beside("lora"), extras.EXTRAS_VERSION, lambda: extras.build_lora(beside("lora"), model, force=force)),
            (beside("embed"), extras.EXTRAS_VERSION,
             lambda: extras.build_embedding(beside("embed"), model, force=force)),
            (beside("rerank"), extras.EXTRAS_VERSION,
             lambda: extras.build_reranker(beside("rerank"), model, force=force)),
            (beside("classify"), extras.EXTRAS_VERSION,
             lambda: extras.build_classifier(beside("classify"), model, force=force)),
            (beside("vlm"), vlm.VLM_VERSION, lambda: vlm.build_vlm(beside("vlm"), model, force=force)),
            (beside("whisper"), speech.SPEECH_VERSION, lambda: speech.build_speech(beside("whisper"), force=force)),
            (beside("audio"), audio_lm.AUDIO_LM_VERSION,
             lambda: audio_lm.build_audio_lm(beside("audio"), model, force=force)),
            (beside("realtime"), realtime.REALTIME_VERSION,
             lambda: realtime.build_realtime(beside("realtime"), model, force=force))):
        existed = not force and text.is_complete(target, version)
        print(f"{'up to date' if existed else 'built'}: {make()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
