"""The conversation tree of one episode: interactions, rewards, discounting and export.

Used by both the gateway's ``Session`` and ``ArealOpenAI``; the functions work on a plain
``dict[str, Interaction]`` in call order, so neither owner needs a second implementation.

    root ─┬─ turn 2 ── turn 3 (leaf)        parent_id links each follow-up call to the call
          └─ turn 2' (leaf, a branch)       whose prompt + sampled tokens its prompt extends

Invariants:
- A child's ``prompt_ids`` start with its parent's ``prompt_ids + output_ids`` (the gateway only
  links a parent when it built the prompt that way); ``concat`` export relies on it and raises
  ``ValueError`` if it is violated.
- Rewards are plain floats on the interactions; ``None`` means unset and counts as 0 wherever
  a number is needed. ``apply_reward_discount`` writes the discounted values back, once.
- Export never re-tokenises: rows are built from the recorded ids, logprobs and versions.

Covered: per-interaction and final rewards, discounting along root-to-leaf paths (a node with
several children takes the mean of their discounted rewards), ``individual`` and ``concat``
export, tensors with a batch dim of 1. Not covered: rewards per token.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import msgspec


class Interaction(msgspec.Struct):
    """One completion, token by token, as the engine produced it. Append fields with defaults."""

    id: str
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    version: int  # policy version (the engine's weight_version) that sampled output_ids
    finish_reason: str
    created: float
    reward: float | None = None
    parent_id: str | None = None  # the interaction whose prompt + output this prompt extends
    messages_hash: str = ""  # hex digest of the normalised (tools, prompt messages, reply) it answers
    output_versions: list[int] = []  # per-token version when a generation spanned a weight update
    tool_calls: int = 0  # well-formed tool calls the gateway parsed out of output_ids (what the agent received)
    malformed_tool_calls: int = 0  # tool calls it tried to make that the parser could not read (ParsedOutput.malformed)
    used_tool_result: bool = False  # the reply's content holds a tool message's content of its history (used_tool_result)
    # the max_tokens the call was granted (after gateway.fit_max_tokens cut it to the context): the
    # limit a finish_reason of "length" hit, DAPO's L_max (areal/controller/dapo.py); 0 when unknown
    max_tokens: int = 0


class InteractionWithTokenLogpReward(msgspec.Struct):
    """One training row: the recorded tokens of one interaction (or one root-to-leaf chain)."""

    interaction: Interaction  # the interaction (the leaf, for a concat row)
    input_ids: list[int]
    loss_mask: list[int]  # 1 on sampled tokens only
    logprobs: list[float]  # engine logprob of each sampled token, 0.0 elsewhere
    versions: list[int]  # policy version of each sampled token, -1 elsewhere
    reward: float

    def to_tensor_dict(self) -> dict[str, Any]:
        """Tensors with a batch dim of 1: ids/mask/logprobs/versions/attention_mask (1, T), rewards (1,)."""
        import torch  # deferred: the gateway process itself never needs torch

        return {
            "input_ids": torch.tensor([self.input_ids], dtype=torch.long),
            "loss_mask": torch.tensor([self.loss_mask], dtype=torch.int32),
            "logprobs": torch.tensor([self.logprobs], dtype=torch.float32),
            "versions": torch.tensor([self.versions], dtype=torch.int32),
            "attention_mask": torch.ones((1, len(self.input_ids)), dtype=torch.bool),
            "rewards": torch.tensor([self.reward], dtype=torch.float32),
        }


def set_reward(interactions: dict[str, Interaction], interaction_id: str, reward: float) -> None:
    """Reward one interaction; ``KeyError`` if it is not in this tree."""
    interactions[interaction_id].reward = _check_reward(reward)


def set_final_reward(interactions: dict[str, Interaction], reward: float) -> str:
    """Reward the most recent interaction; returns its id. ``LookupError`` if there is none."""
    if not interactions:
        raise LookupError("no interaction to reward yet")
    last = next(reversed(interactions.values()))
    last.reward = _check_reward(reward)
    return last.id


def _check_reward(reward: Any) -> float:
    """``reward`` as a float: ``TypeError`` if it is not a number, ``ValueError`` if not finite
    (inf as well as NaN: either poisons every advantage of its group)."""
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise TypeError(f"reward must be a finite number, got {reward!r} of type {type(reward).__name__}")
    if not -sys.float_info.max <= reward <= sys.float_info.max:  # NaN fails too; exact for huge ints
        raise ValueError(f"reward must be a finite number, got {reward!r}")
    return float(reward)


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where two prompts' ids ``a`` and ``b`` differ (the shorter one's length
    when it is a prefix): where a replayed call left its record (areal/replay.py, branching.replayed)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def extended_by(interactions: Iterable[Interaction], ids: list[int]) -> Interaction | None:
    """The interaction whose prompt + sampled ids ``ids`` starts with, the longest one (None: none
    does): the parent of a call whose prompt the caller built from the tokens themselves."""
    best: Interaction | None = None
    longest = 0
    for inter in interactions:
        n = len(inter.prompt_ids) + len(inter.output_ids)
        if (
            longest < n <= len(ids)
            and ids[: len(inter.prompt_ids)] == inter.prompt_ids
            and ids[len(inter.prompt_ids) : n] == inter.output_ids
        ):
            best, longest = inter, n
    return best


def children_of(interactions: dict[str, Interaction]) -> dict[str, list[str]]:
    """Child ids of every interaction, in call order (interactions whose parent left the tree are roots)."""
    children: dict[str, list[str]] = {i: [] for i in interactions}
    for inter in interactions.values():
        if inter.parent_id is not None and inter.parent_id in children:
            children[inter.parent_id].append(inter.id)
    return children


def leaves(interactions: dict[str, Interaction]) -> list[str]:
    return [i for i, c in children_of(interactions).items() if not c]


def apply_reward_discount(interactions: dict[str, Interaction], turn_discount: float) -> None:
    """r'ᵢ = rᵢ + γ·r'ᵢ₊₁ along each root-to-leaf path (unset = 0); a node with several children
    adds γ times the mean of their r'. Children are always created after their parent, so one
    pass in reverse call order sees every child before its parent."""
    if not 0.0 <= turn_discount <= 1.0:
        raise ValueError(f"turn_discount must be in [0, 1], got {turn_discount}")
    children = children_of(interactions)
    for inter in reversed(list(interactions.values())):
        kids = children[inter.id]
        future = sum(interactions[k].reward for k in kids) / len(kids) if kids else 0.0  # type: ignore[misc]
        inter.reward = (inter.reward or 0.0) + turn_discount * future


def export_interactions(interactions: dict[str, Interaction], style: str = "individual") -> dict[str, InteractionWithTokenLogpReward]:
    """``individual``: one row per interaction. ``concat``: one row per leaf holding its whole
    root-to-leaf chain, later turns' prompt tokens masked out except the ones sampled earlier."""
    if style == "individual":
        return {i.id: _row([i]) for i in interactions.values()}
    if style == "concat":
        return {leaf: _row(_chain(interactions, leaf)) for leaf in leaves(interactions)}
    raise ValueError(f"style must be 'individual' or 'concat', got {style!r}")


def _chain(interactions: dict[str, Interaction], leaf_id: str) -> list[Interaction]:
    chain = [interactions[leaf_id]]
    while chain[-1].parent_id is not None and chain[-1].parent_id in interactions:
        chain.append(interactions[chain[-1].parent_id])
    return chain[::-1]


def _row(chain: list[Interaction]) -> InteractionWithTokenLogpReward:
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    for inter in chain:
        if inter.prompt_ids[: len(ids)] != ids:
            raise ValueError(f"interaction {inter.id}: prompt does not extend its parent's tokens")
        new_prompt = len(inter.prompt_ids) - len(ids)
        ids += inter.prompt_ids[len(ids) :] + inter.output_ids
        mask += [0] * new_prompt + [1] * len(inter.output_ids)
        logprobs += [0.0] * new_prompt + inter.output_logprobs
        versions += [-1] * new_prompt + (inter.output_versions or [inter.version] * len(inter.output_ids))
    leaf = chain[-1]
    return InteractionWithTokenLogpReward(
        interaction=leaf,
        input_ids=ids,
        loss_mask=mask,
        logprobs=logprobs,
        versions=versions,
        reward=leaf.reward or 0.0,
    )
