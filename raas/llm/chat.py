"""Chat rendering with the model's own template, and the token deltas that keep a trajectory
from drifting.

The first prompt is the template's rendering of the system and user messages. After that, the
tokens the model generated are kept exactly as they came, and each observation (tool result,
user turn) is appended as the token delta that the template adds for it (``turn_delta``):
earlier turns are never re-tokenized, so what the trainer sees is exactly what the policy saw
and produced (raas.wire.Trajectory holds the tokens and checks that invariant).
"""

from __future__ import annotations

import functools
import json
from typing import Any

# A fixed conversation used to measure what the template adds after a finished assistant turn.
_BASE = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "a"},
]


def render_text(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
) -> str:
    messages = with_tools(tokenizer, messages, tools)
    shown = tools if tools and supports_tools(tokenizer) else None
    text = render_plain(tokenizer, messages, shown, add_generation_prompt)
    if text is not None:
        return text
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
    if shown:
        kwargs["tools"] = shown
    return str(tokenizer.apply_chat_template(messages, **kwargs))


def render_plain(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
) -> str | None:
    """``apply_chat_template``'s text for a conversation of plain JSON values, rendered by the
    same compiled template in the same sandbox; None where it does not apply (then
    ``apply_chat_template`` renders it).

    Every agent turn and gateway call renders a conversation, and transformers' own path walks
    the whole of it twice more before the template sees it (to turn message objects into dicts,
    then into plain JSON values): most of a render's time. Messages parsed from JSON or built by
    raas are plain already, so they go to the template as they are, with transformers' own
    steps that change what it sees (None keys dropped, reasoning aliased). The template's
    environment is immutable, so it cannot change the caller's messages.
    """
    template = getattr(tokenizer, "chat_template", None)
    library = _template_steps()
    if library is None or type(template) is not str:  # a dict of templates: transformers picks
        return None
    compile_template, alias = library
    chat = []
    for message in messages:
        if type(message) is not dict:
            return None
        kept = {k: v for k, v in message.items() if v is not None}
        if not _plain(kept):
            return None
        chat.append(kept)
    extra = tokenizer.special_tokens_map
    if not (_plain(tools) and _plain(extra)):
        return None
    text = compile_template(template).render(
        messages=alias(chat),
        tools=tools,
        documents=None,
        add_generation_prompt=add_generation_prompt,
        **extra,
    )
    return str(text)


@functools.cache
def _template_steps() -> tuple[Any, Any] | None:
    """transformers' own template compiler (cached, sandboxed) and reasoning aliases, so that
    both paths render alike; None with a transformers that has them not (then its
    apply_chat_template renders everything). Imported at first use: transformers is slow to
    import, and this module is imported where no template is rendered."""
    try:
        from transformers.utils import chat_template_utils as library
    except ImportError:
        return None
    steps = (
        getattr(library, "_compile_jinja_template", None),
        getattr(library, "_alias_reasoning_fields", None),
    )
    return None if None in steps else steps


def _plain(value: Any) -> bool:
    """Is ``value`` made of JSON's own types only (exact types: no subclass, no tuple)?"""
    kind = type(value)
    if value is None or kind is str or kind is int or kind is float or kind is bool:
        return True
    if kind is list:
        return all(_plain(v) for v in value)
    if kind is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    return False


def encode(tokenizer: Any, text: str) -> list[int]:
    """The token ids of ``text``, no special tokens added: ``tokenizer.encode``'s.

    A transformers tokenizer over the tokenizers library's is asked directly where that gives
    ``encode``'s own ids: its Python layer (padding and truncation settings, batching one text,
    reading the result back) cost about 40% of a gateway call's tokenizing, on every call."""
    backend = _backend(tokenizer)
    if backend is not None:
        return list(backend.encode(text, add_special_tokens=False).ids)
    return list(tokenizer.encode(text, add_special_tokens=False))


def _backend(tokenizer: Any) -> Any:
    """The tokenizers library's ``Tokenizer`` under ``tokenizer``, where encoding with it gives
    what ``tokenizer.encode(text, add_special_tokens=False)`` gives; else None.

    That holds for transformers' own TokenizersBackend class (a subclass that changes how it
    encodes is left alone), while its Tokenizer neither pads nor truncates (transformers' encode
    turns both off for a call without them) and reads special tokens in a text as it is told to
    (``split_special_tokens``, which transformers' encode sets on the Tokenizer each call)."""
    # The instance's own attribute: a wrapper that forwards attributes encodes its own way.
    backend = vars(tokenizer).get("_tokenizer") if hasattr(tokenizer, "__dict__") else None
    kind: type = type(tokenizer)
    if backend is None or not _encodes_plainly(kind):
        return None
    split = bool(getattr(tokenizer, "split_special_tokens", False))
    if backend.truncation is not None or backend.padding is not None:
        return None
    return backend if backend.encode_special_tokens == split else None


@functools.cache
def _encodes_plainly(kind: type) -> bool:
    """Does the tokenizer class ``kind`` encode as transformers' TokenizersBackend does?"""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return False
    return (
        issubclass(kind, TokenizersBackend)
        and kind.encode is PreTrainedTokenizerBase.encode
        and kind._encode_plus is TokenizersBackend._encode_plus
        and kind._convert_encoding is TokenizersBackend._convert_encoding
    )


REPLACEMENT = "\ufffd"
MAX_SPLIT = 4  # a UTF-8 character has at most 4 bytes, so spans at most 4 byte-level tokens


def token_texts(tokenizer: Any, ids: list[int]) -> list[str | None]:
    """Each token's text, special tokens included; None for an id the tokenizer lacks.

    A character whose bytes are spread over several tokens (an emoji in a byte-level BPE)
    decodes to U+FFFD token by token: it is shown whole on its last token, the others empty.
    """
    size = len(tokenizer)
    known = [i if 0 <= i < size else None for i in ids]
    pieces = iter(
        tokenizer.batch_decode(
            [[i] for i in known if i is not None],
            skip_special_tokens=False,
            clean_up_tokenization_spaces=False,
        )
    )
    texts: list[str | None] = [None if i is None else str(next(pieces)) for i in known]
    start: int | None = None
    for k, text in enumerate(texts):
        if start is None and (text is None or REPLACEMENT not in text):
            continue
        if text is None:  # an unknown id ends any character being put together
            start = None
            continue
        start = k if start is None else start
        joint = tokenizer.decode(
            ids[start : k + 1], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        if REPLACEMENT not in joint or k - start + 1 >= MAX_SPLIT:
            if REPLACEMENT not in joint:
                texts[start:k] = [""] * (k - start)
                texts[k] = joint
            start = None
    return texts


def supports_tools(tokenizer: Any) -> bool:
    return "tools" in (getattr(tokenizer, "chat_template", None) or "")


def tools_prompt(tools: list[dict[str, Any]]) -> str:
    """Hermes-style tool instructions, for templates that do not render tools themselves."""
    schemas = "\n".join(json.dumps(t) for t in tools)
    return (
        "You may call tools. Their JSON schemas:\n<tools>\n"
        f"{schemas}\n</tools>\n"
        "To call one, answer with\n"
        '<tool_call>\n{"name": "<tool name>", "arguments": {...}}\n</tool_call>'
    )


def with_tools(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    if not tools or supports_tools(tokenizer):
        return messages
    block = tools_prompt(tools)
    if messages and messages[0].get("role") == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{block}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def observation_delta(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """The tokens the template puts after a finished assistant turn for ``messages``, up to and
    including the next assistant header.

    The model's own turn ends with its end-of-turn token; what the template writes after that
    token (ChatML: a newline) belongs to the delta too.
    """
    prefix, after_eos = _base_tokens(tokenizer)
    full = encode(tokenizer, render_text(tokenizer, _BASE + messages, add_generation_prompt=True))
    if full[: len(prefix)] != list(prefix):
        raise ValueError(
            "the chat template does not render a conversation as a prefix of its sequel"
        )
    return list(after_eos) + full[len(prefix) :]


def turn_delta(tokenizer: Any, ids: list[int], messages: list[dict[str, Any]]) -> list[int]:
    """The tokens that follow the model's turn at the end of ``ids`` when ``messages`` come next.

    Its end-of-turn token first, where the model did not write it (cut off at max_tokens or at a
    stop string), then the template's delta for ``messages`` up to the next assistant header.
    """
    return end_of_turn(tokenizer, ids) + observation_delta(tokenizer, messages)


def split_point(tokenizer: Any, text: str) -> int | None:
    """Where ``text`` can be cut so that its tokens are the two parts' tokens end to end: just
    past its last end-of-turn token, where the tokenizer splits before anything else (a special
    token that strips no whitespace after it). None where the text or the tokenizer has none.

    So a conversation rendered again with new messages after that point re-tokenizes only them.
    """
    eos = tokenizer.eos_token
    at = text.rfind(eos) if eos and _splits_at_eos(tokenizer) else -1
    return None if at < 0 else at + len(eos)


@functools.lru_cache(maxsize=8)
def _splits_at_eos(tokenizer: Any) -> bool:
    """Is every end-of-turn token in a text read as that token, which ends what precedes it?"""
    if getattr(tokenizer, "split_special_tokens", False):  # read as plain text instead
        return False
    added = getattr(tokenizer, "added_tokens_decoder", {}).get(tokenizer.eos_token_id)
    return bool(added is not None and added.special and not added.rstrip)


def end_of_turn(tokenizer: Any, ids: list[int]) -> list[int]:
    """The end-of-turn token where the model's turn at the end of ``ids`` lacks it (cut off at
    max_tokens or at a stop string); nothing where it wrote it."""
    return [] if ids and ids[-1] == tokenizer.eos_token_id else [tokenizer.eos_token_id]


def sequel_delta(
    tokenizer: Any,
    before: list[dict[str, Any]],
    after: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
) -> list[int] | None:
    """The tokens the template adds to the finished conversation ``before`` (its last turn the
    model's) for ``after``: what it writes after the last end-of-turn token, up to the next
    assistant header. None where the template renders ``before + after`` as something other
    than ``before``'s rendering continued: it rewrites earlier turns (Qwen3's drops the reasoning
    of the assistant turns before the latest user message)."""
    head = encode(tokenizer, render_text(tokenizer, before, tools))
    full = encode(tokenizer, render_text(tokenizer, before + after, tools, True))
    if len(full) <= len(head) or full[: len(head)] != head:
        return None
    return _after_eos(tokenizer, head) + full[len(head) :]


@functools.lru_cache(maxsize=8)
def _base_tokens(tokenizer: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The fixed conversation's tokens, and those the template writes after its end-of-turn
    token: the same for every turn of every rollout, so rendered once per tokenizer."""
    prefix = encode(tokenizer, render_text(tokenizer, _BASE))
    return tuple(prefix), tuple(_after_eos(tokenizer, prefix))


def _after_eos(tokenizer: Any, ids: list[int]) -> list[int]:
    """What follows the last end-of-turn token of ``ids`` (ChatML: a newline)."""
    eos = tokenizer.eos_token_id
    if eos not in ids:
        return []
    last = max(i for i, t in enumerate(ids) if t == eos)
    return ids[last + 1 :]
