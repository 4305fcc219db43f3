"""vLLM logprobs (per position: {token_id: Logprob(logprob, rank, decoded_token)}) → OpenAI shapes."""

from collections.abc import Sequence
from typing import Any

from app.protocol.chat import TokenLogprob, TopLogprob
from app.protocol.completions import CompletionLogprobs

FLOOR = -9999.0  # JSON has no -inf; vLLM clamps the same way


def _value(logprob: float) -> float:
    return max(logprob, FLOOR)


class CompletionLogprobsBuilder:
    """Completion logprobs chunk by chunk, with `text_offset` as real offsets into the returned text.

    Each token is found where the text so far continues; a token the text does not show there (a
    special token such as bos, or a piece of a multi-byte character) gets the current offset and
    takes no room. Offsets continue across stream chunks and are never negative.
    """

    __slots__ = ("text", "offset")

    def __init__(self) -> None:
        self.text = ""
        self.offset = 0

    def build(self, text: str, token_ids: Sequence[int], positions: Sequence[dict[int, Any] | None],
              fallback_tokens: Sequence[str] = ()) -> CompletionLogprobs:
        """`text`: the text this chunk adds to the choice; the tokens and their logprobs produced it."""
        self.text += text
        result = CompletionLogprobs(text_offset=[], token_logprobs=[], tokens=[], top_logprobs=[])
        for i, (token_id, position) in enumerate(zip(token_ids, positions, strict=True)):
            chosen = position.get(token_id) if position else None
            token = chosen.decoded_token if chosen is not None and chosen.decoded_token is not None else (
                fallback_tokens[i] if i < len(fallback_tokens) else "")
            result.tokens.append(token)
            result.text_offset.append(self.offset)
            if token and self.text.startswith(token, self.offset):
                self.offset += len(token)
            result.token_logprobs.append(_value(chosen.logprob) if chosen is not None else None)
            result.top_logprobs.append(
                {(lp.decoded_token or ""): _value(lp.logprob) for lp in position.values()} if position else None
            )
        return result


def chat_logprobs(token_ids: Sequence[int], positions: Sequence[dict[int, Any]], top_k: int) -> list[TokenLogprob]:
    content = []
    for token_id, position in zip(token_ids, positions, strict=True):
        chosen = position[token_id]
        ranked = sorted(position.values(), key=lambda lp: lp.rank if lp.rank is not None else 0)
        top = [TopLogprob(token=lp.decoded_token or "", logprob=_value(lp.logprob), bytes=_bytes(lp.decoded_token))
               for lp in ranked[:top_k]]
        token = chosen.decoded_token or ""
        content.append(TokenLogprob(token=token, logprob=_value(chosen.logprob), bytes=_bytes(chosen.decoded_token),
                                    top_logprobs=top))
    return content


def _bytes(token: str | None) -> list[int] | None:
    return None if token is None else list(token.encode("utf-8"))
