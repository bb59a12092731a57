"""What a backend's answer must be before anything uses it.

A backend is outside raas: a broken server (or one that lies) can answer anything, and what it
answers becomes a trajectory that a trainer learns from and a row of the result store. A NaN
logprob that passed the client once ended as a job ``done`` with reward 1.0 whose stored row
could not be read back. So every answer is checked before it is used: one finite logprob per
token id (and one weight version a token where the backend gives versions), no more tokens than
were asked for, and every id an integer inside the vocabulary.
"""

from __future__ import annotations

import math

from raas.llm.types import Generation


def answer_problem(generation: Generation, max_tokens: int, vocab_size: int | None) -> str | None:
    """What is wrong with ``generation`` as an answer to a request for ``max_tokens``, or None.

    ``vocab_size`` is the tokenizer's size where it is known (ids must be below it); None checks
    ids for being non-negative integers only.
    """
    ids, logprobs = generation.token_ids, generation.logprobs
    if len(ids) != len(logprobs):
        return f"returned {len(ids)} token ids but {len(logprobs)} logprobs"
    versions = generation.policy_versions
    if versions is not None and len(versions) != len(ids):
        return f"returned {len(ids)} token ids but weight versions for {len(versions)}"
    if len(ids) > max_tokens:
        return f"returned {len(ids)} tokens where at most {max_tokens} were asked for"
    # One pass in C for the usual answer; the loops below only name what is wrong.
    if not set(map(type, ids)) <= {int}:
        bad = next(t for t in ids if type(t) is not int)
        return f"returned a token id that is not an integer: {bad!r}"
    if ids and (min(ids) < 0 or (vocab_size is not None and max(ids) >= vocab_size)):
        limit = "" if vocab_size is None else f" (the vocabulary has {vocab_size})"
        i, bad = next((i, t) for i, t in enumerate(ids) if t < 0 or t >= (vocab_size or t + 1))
        return f"returned token id {bad} at position {i}, outside the vocabulary{limit}"
    if not math.isfinite(sum(logprobs)):  # finite values too large to add say nothing here
        for i, value in enumerate(logprobs):
            if not math.isfinite(value):
                return f"returned logprob {value} at position {i} (logprobs must be finite)"
    return None
