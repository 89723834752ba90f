"""OpenAI's Completions front-end (``POST /v1/completions``): a prompt the client wrote itself.

    {"prompt": "<|im_start|>user ...", "max_tokens": 64}  ─► prompt ids (the tokenizer's, or the ids given)
        ─► Gateway.complete_prompt: n engine calls, each recorded as an Interaction of the session
        ◄─ {"object": "text_completion", "choices": [{"text", "token_ids", "finish_reason", "logprobs"}], "usage"}

SGLang's and vLLM's OpenAI servers answer this route too; clients that render their own prompt use
it (AReaL's scaffolding worker, text agents with a template of their own). No chat template is
applied and nothing is parsed out of the reply: the text is the sampled tokens decoded, cut at the
first stop string. Each choice carries ``token_ids``, the ids it sampled (vLLM's
``return_token_ids``; sent always): a client that builds its training row from the reply holds
exactly what was sampled. A prompt that extends an earlier call's prompt and sampled ids in the
same session gets that call as its parent, so multi-turn text is one recorded chain.

Honoured: prompt (one string, or one list of token ids), model (echoed), max_tokens, temperature,
top_p, seed, stop, n, logprobs (an integer, OpenAI's: up to that many top alternatives per token;
0 for the sampled token's alone), echo false, best_of equal to n, vLLM's ``add_special_tokens``
(default true, as vLLM and SGLang tokenise a completion prompt: a tokenizer that adds a BOS adds
it), and SGLang's and vLLM's sampling extensions (top_k, min_p, repetition_penalty). Accepted and
ignored (they change no token): user, and penalties at 0. Anything else is a 400 naming it: a
batch of prompts, stream, echo true, suffix, logit_bias, best_of above n.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from areal.gateway.chat import body_head, usage
from areal.gateway.contract import (
    EXTENSION_FIELDS,
    Choice,
    Reply,
    RequestError,
    Sampling,
    check_parameters,
    given,
    new_id,
    sampling_extensions,
)

if TYPE_CHECKING:
    from areal.gateway.core import Gateway, Session

_HONOURED = {"prompt", "model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "logprobs", "echo", "best_of"}
_HONOURED |= {"add_special_tokens"} | (EXTENSION_FIELDS - {"chat_template_kwargs"})
_NEUTRAL = {"user"}
_NOOP_VALUES: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0, 0.0, None),
    "presence_penalty": (0, 0.0, None),
    "stream": (False, None),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
}


def request_sampling(body: dict, default_max_tokens: int) -> Sampling:
    """The body's sampling; a 400 naming a parameter this front-end cannot honour."""
    check_parameters(body, _HONOURED, _NEUTRAL, _NOOP_VALUES, "this gateway's /v1/completions")
    if body.get("echo") not in (None, False):
        raise RequestError(400, "echo=true is not supported: the reply holds the sampled text only", param="echo")
    logprobs = body.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= 5):
        raise RequestError(400, f"logprobs must be an integer in [0, 5] (OpenAI's), got {logprobs!r}", param="logprobs")
    n = given(body, "n", 1)
    if body.get("best_of") not in (None, n):
        raise RequestError(
            400, f"best_of={body['best_of']!r} is not supported: every sampled choice is returned (best_of = n)", param="best_of"
        )
    stop = body.get("stop")
    return Sampling(
        max_tokens=given(body, "max_tokens", default_max_tokens),
        temperature=given(body, "temperature", 1.0),
        top_p=given(body, "top_p", 1.0),
        seed=body.get("seed"),
        stop=[] if stop is None else [stop] if isinstance(stop, str) else stop,
        n=n,
        logprobs=logprobs is not None,
        top_logprobs=logprobs or 0,
        **sampling_extensions(body),
    )


def prompt_ids(gateway: Gateway, body: dict) -> list[int]:
    """The prompt as ids: a string tokenised (with the tokenizer's special tokens when
    ``add_special_tokens``), or one list of ids checked against the vocabulary."""
    prompt, special = body.get("prompt"), body.get("add_special_tokens", True)
    if not isinstance(special, bool):
        raise RequestError(400, "add_special_tokens must be a boolean", param="add_special_tokens")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:  # its size is bounded by the body's (gateway.max_body_bytes, routes.py)
            raise RequestError(400, "prompt must be a non-empty string", param="prompt")
        return list(gateway.tokenizer.encode(prompt, add_special_tokens=special))
    vocabulary = len(gateway.tokenizer)
    if isinstance(prompt, list) and prompt and all(type(t) is int and 0 <= t < vocabulary for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise RequestError(400, f"a batch of {len(prompt)} prompts is not supported: send one prompt a request", param="prompt")
    raise RequestError(400, f"prompt must be a string or a list of token ids in [0, {vocabulary})", param="prompt")


async def handle(gateway: Gateway, session: Session, body: dict) -> Reply:
    sampling = request_sampling(body, gateway.config.default_max_tokens)
    ids = prompt_ids(gateway, body)
    response_id = new_id("cmpl-")
    choices = await gateway.complete_prompt(session, ids, sampling, response_id=response_id)
    model = body.get("model") or gateway.config.model_name
    return Reply(status=200, body=completion_body(response_id, model, choices))


def _logprobs(choice: Choice) -> dict | None:
    """OpenAI's legacy shape: tokens, their logprobs, their text offsets, the top alternatives."""
    if choice.logprobs is None:
        return None
    offsets, at = [], 0
    for t in choice.logprobs:
        offsets.append(at)
        at += len(t.token)
    return {
        "tokens": [t.token for t in choice.logprobs],
        "token_logprobs": [t.logprob for t in choice.logprobs],
        "top_logprobs": [dict(t.top) for t in choice.logprobs],
        "text_offset": offsets,
    }


def completion_body(response_id: str, model: str, choices: list[Choice]) -> dict:
    return {
        **body_head(response_id, "text_completion", model),
        "choices": [
            {
                "index": c.index,
                "text": c.parsed.content,
                "logprobs": _logprobs(c),
                "finish_reason": c.finish_reason,
                "token_ids": c.token_ids,
            }
            for c in choices
        ],
        "usage": usage(choices),
    }
