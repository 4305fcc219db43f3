"""The engine's logprobs (per position: {token_id: Logprob(logprob, rank, decoded_token)}) → OpenAI shapes."""

from collections.abc import Sequence

from choir.core.protocol.chat import TokenLogprob, TopLogprob
from choir.core.protocol.common import PromptLogprob, PromptLogprobs
from choir.core.protocol.completions import CompletionLogprobs
from choir.engine.outputs import Logprob, Position

FLOOR = -9999.0  # JSON has no -inf; vLLM clamps the same way


def _value(logprob: float) -> float:
    return max(logprob, FLOOR)


def token_id_string(token_id: int) -> str:
    """`return_tokens_as_token_ids`: a token as vLLM names it, for tokens that are not valid text alone."""
    return f"token_id:{token_id}"


def wire_prompt_logprobs(positions: Sequence[Position | None] | None) -> PromptLogprobs:
    """The engine's prompt logprobs as JSON: per position null (the first) or {token id: its logprob}."""
    return [None if position is None else {
        str(token_id): PromptLogprob(logprob=_value(lp.logprob), rank=lp.rank, decoded_token=lp.decoded_token)
        for token_id, lp in position.items()} for position in positions or []]


class CompletionLogprobsBuilder:
    """Completion logprobs chunk by chunk, with `text_offset` as real offsets into the returned text.

    Each token is found where the text so far continues; a token the text does not show there (a
    special token such as bos, or a piece of a multi-byte character) gets the current offset and
    takes no room. Offsets continue across stream chunks and are never negative.
    """

    __slots__ = ("text", "offset", "as_token_ids")

    def __init__(self, as_token_ids: bool = False) -> None:
        self.text = ""
        self.offset = 0
        self.as_token_ids = as_token_ids  # tokens named `token_id:<id>`; offsets still follow the text

    def build(self, text: str, token_ids: Sequence[int], positions: Sequence[Position | None],
              fallback_tokens: Sequence[str] = ()) -> CompletionLogprobs:
        """`text`: the text this chunk adds to the choice; the tokens and their logprobs produced it."""
        self.text += text
        result = CompletionLogprobs(text_offset=[], token_logprobs=[], tokens=[], top_logprobs=[])
        for i, (token_id, position) in enumerate(zip(token_ids, positions, strict=True)):
            chosen = position.get(token_id) if position else None
            token = chosen.decoded_token if chosen is not None and chosen.decoded_token is not None else (
                fallback_tokens[i] if i < len(fallback_tokens) else "")
            result.tokens.append(token_id_string(token_id) if self.as_token_ids else token)
            result.text_offset.append(self.offset)
            if token and self.text.startswith(token, self.offset):
                self.offset += len(token)
            result.token_logprobs.append(_value(chosen.logprob) if chosen is not None else None)
            result.top_logprobs.append(self._top(position) if position else None)
        return result

    def _top(self, position: Position) -> dict[str, float]:
        if self.as_token_ids:
            return {token_id_string(token_id): _value(lp.logprob) for token_id, lp in position.items()}
        return {(lp.decoded_token or ""): _value(lp.logprob) for lp in position.values()}


def chat_logprobs(token_ids: Sequence[int], positions: Sequence[Position], top_k: int | None,
                  as_token_ids: bool = False) -> list[TokenLogprob]:
    """`top_k` None: every candidate the engine returned (the ids of `logprob_token_ids`). With
    `as_token_ids` tokens are named `token_id:<id>`; `bytes` are always the token's own text."""
    content = []
    for token_id, position in zip(token_ids, positions, strict=True):
        chosen = position[token_id]
        ranked = sorted(position.items(), key=lambda item: item[1].rank if item[1].rank is not None else 0)
        top = [TopLogprob(token=_name(candidate, lp, as_token_ids), logprob=_value(lp.logprob),
                          bytes=_bytes(lp.decoded_token))
               for candidate, lp in (ranked if top_k is None else ranked[:top_k])]
        content.append(TokenLogprob(token=_name(token_id, chosen, as_token_ids), logprob=_value(chosen.logprob),
                                    bytes=_bytes(chosen.decoded_token), top_logprobs=top))
    return content


def _name(token_id: int, logprob: Logprob, as_token_ids: bool) -> str:
    return token_id_string(token_id) if as_token_ids else (logprob.decoded_token or "")


def _bytes(token: str | None) -> list[int] | None:
    return None if token is None else list(token.encode("utf-8"))
