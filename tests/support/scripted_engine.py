"""A stand-in for ``EngineClient``'s ``generate`` / ``generate_stream`` that answers each request
with the canonical ids of the next scripted reply, then its stop token (streamed one token per
update), recording every prompt and its sampling parameters: the gateway's tests of model
families and chat templates, which assert ids and parsing, never what a model would say."""

from __future__ import annotations

from areal.engine.client import GenerateResult


class ScriptedEngine:
    def __init__(self, tok, replies: list[tuple[str, str]], logprobs: list[float] | None = None) -> None:
        """``replies``: (text, the name of the stop token ending it), in the order requests come;
        ``logprobs``: the logprob every token of each reply is sampled with, in the same order
        (-0.5 for replies past its end, and for all without it; tests may add replies later)."""
        self.tok, self.replies, self.prompts, self.params = tok, list(replies), [], []
        self.logprobs = list(logprobs or ())

    def _next(self, input_ids, params) -> tuple[list[int], float]:
        self.prompts.append(list(input_ids))
        self.params.append(params)
        text, stop = self.replies.pop(0)
        return self.tok.encode(text, add_special_tokens=False) + [self.tok.convert_tokens_to_ids(stop)], (
            self.logprobs.pop(0) if self.logprobs else -0.5
        )

    @staticmethod
    def _result(ids: list[int], logprob: float, prompt: int, finish: str) -> GenerateResult:
        return GenerateResult(
            output_ids=ids,
            output_logprobs=[logprob] * len(ids),
            finish_reason=finish,
            weight_version="1",
            prompt_tokens=prompt,
            completion_tokens=len(ids),
        )

    async def generate(self, input_ids, sampling_params, return_logprob=True, rid=None, **kw) -> GenerateResult:
        return self._result(*self._next(input_ids, sampling_params), len(input_ids), "stop")

    async def generate_stream(self, input_ids, sampling_params, return_logprob=True, rid=None, **kw):
        ids, logprob = self._next(input_ids, sampling_params)
        for i in range(1, len(ids) + 1):
            yield self._result(ids[:i], logprob, len(input_ids), "stop" if i == len(ids) else "")
