"""POST /v1/audio/transcriptions and /v1/audio/translations: OpenAI's multipart form (`file`, `model`, `language`,
`prompt`, `response_format`, `temperature`, `timestamp_granularities[]`, `stream`) and vLLM's sampling extras,
read as the upload streams in (bounded by CHOIR_MAX_AUDIO_BYTES); choir/app/serving/speech.py does the rest."""

from typing import Any

import msgspec
from litestar import Request, Response
from litestar.datastructures import UploadFile

from choir.app.request_ids import HEADER, request_base_id
from choir.app.request_log import annotate
from choir.app.routes.disconnect import unless_disconnected
from choir.app.routes.multipart import multipart_form
from choir.app.routes.replies import sse_response
from choir.app.serving.counts import TokenCounts
from choir.app.serving.speech import plan_speech, run_chunks, stream_chunks
from choir.app.serving.speech_formats import MEDIA_TYPES, event_frames
from choir.app.serving.speech_formats import answer as answer_body
from choir.core.errors import bad_request
from choir.core.protocol.audio import TranscriptionForm
from choir.engine.speech import Task
from choir.plugins.pipeline import PipelineDependency
from choir.plugins.spec import operation

LIST_FIELDS = ("timestamp_granularities", "include")
FIELDS = "`file`, `model` and the options"


async def _read(request: Request, pipeline: PipelineDependency) -> tuple[TranscriptionForm, bytes]:
    policy = pipeline.audio
    async with multipart_form(request, policy.max_bytes, policy.too_large("file"), FIELDS, max_parts=64) as form:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise bad_request("`file` is required: the audio, as a multipart file field.", "file")
        fields = _fields(form)
        data = await upload.read()
    try:
        return msgspec.convert(fields, TranscriptionForm, strict=False), data
    except msgspec.ValidationError as exc:
        raise bad_request(f"The form is invalid: {exc}.", _param(str(exc))) from None


def _fields(form: dict[str, Any]) -> dict[str, Any]:
    """The text fields, as the form type reads them: `name[]` fields as lists, vllm_xargs as JSON."""
    fields: dict[str, Any] = {}
    for name, value in form.items():
        if name == "file":
            continue
        key = name.removesuffix("[]")
        key = f"{key}[]" if key in LIST_FIELDS else key  # sent with or without the brackets
        values = value if isinstance(value, list) else [value]
        if any(isinstance(each, UploadFile) for each in values):
            raise bad_request(f"`{key}` must be a text field, not a file.", key)
        if key.endswith("[]"):
            fields[key] = fields.get(key, []) + values
        elif len(values) > 1:
            raise bad_request(f"The field `{key}` is sent twice: send it once.", key)
        elif key == "vllm_xargs":
            try:
                fields[key] = msgspec.json.decode(values[0])
            except msgspec.DecodeError:
                raise bad_request("vllm_xargs must be a JSON object.", key) from None
        else:
            fields[key] = values[0]
    return fields


def _param(message: str) -> str | None:
    """The field a msgspec error names: `$.temperature`, or the unknown field."""
    if "unknown field `" in message:
        return message.split("unknown field `", 1)[1].split("`", 1)[0]
    if "at `$." in message:
        return message.split("at `$.", 1)[1].split("`", 1)[0].split("[", 1)[0]
    if "at `$[" in message:  # a field whose name has brackets
        return message.split("at `$[", 1)[1].split("]", 1)[0].strip("'\"[]").removesuffix("[]")
    return None


async def _serve(request: Request, pipeline: PipelineDependency, task: Task) -> Response:
    form, data = await _read(request, pipeline)
    base_id = request_base_id(request, form.request_id)
    request_id = f"{task}-{base_id}"
    annotate(request.scope, response_id=request_id)

    async def answer() -> Response:
        """Planned (decoding, language detection) and answered while the client waits: one that leaves stops it."""
        plan = await plan_speech(pipeline, form, data, task, request_id)
        counts = TokenCounts(prompt_tokens=plan.prompt_tokens)  # for the request's log line
        annotate(request.scope, tokens=counts)
        if form.stream:
            return await sse_response(event_frames(plan, stream_chunks(pipeline, plan, request_id), counts),
                                      base_id, request_id)
        results = await run_chunks(pipeline, plan, request_id)
        counts.completion_tokens = sum(len(result.token_ids) for result in results)
        return Response(answer_body(plan, results), media_type=MEDIA_TYPES[form.response_format],
                        headers={HEADER: base_id})

    return await unless_disconnected(request.receive, answer())


@operation("createTranscription")
async def create_transcription(request: Request, pipeline: PipelineDependency) -> Response:
    return await _serve(request, pipeline, "transcribe")


@operation("createTranslation")
async def create_translation(request: Request, pipeline: PipelineDependency) -> Response:
    return await _serve(request, pipeline, "translate")


AUDIO_HANDLERS = [create_transcription, create_translation]
