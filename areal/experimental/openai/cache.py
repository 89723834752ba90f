"""AReaL's ``areal.experimental.openai.cache``: ``InteractionCache``, a workflow's own call trace.

    cache[call_id] = InteractionWithTokenLogpReward(model_response=..., messages=[...])
        └─ parent: the longest earlier call whose messages + reply start this call's messages
    cache.set_reward(call_id, r) / set_last_reward(r) / apply_reward_discount(γ)
    cache.export_interactions("individual" | "concat") ─► {id: interaction} the workflow returns

An ordered dict (insertion order is call order) of ``types.InteractionWithTokenLogpReward``, with
AReaL's methods, for workflows that trace calls themselves (AReaL's scaffolding controllers keep
one). Rewards and discounting follow AReaL's: the discount runs backwards over insertion order,
once; an unset reward counts 0. ``concat`` export returns the leaves (calls no later call
extends), each of which holds its ancestors' tokens in its row (``chat_template_type="concat"``).

Invariants: a call's parent was inserted before it and its messages plus reply are a prefix of the
call's messages; export skips a call that has no id or no reply yet (still in flight) and refuses
one filed under another id. Not covered: AReaL's warning about near-miss parents (a reply re-sent
with different keys): such a call simply has no parent.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from areal.experimental.openai.types import InteractionWithTokenLogpReward

__all__ = ["InteractionCache"]


class InteractionCache(OrderedDict[str, InteractionWithTokenLogpReward]):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._discounted = False
        self._total_reward = 0.0
        self._lock = threading.Lock()

    def __deepcopy__(self, memo: dict) -> InteractionCache:
        """An empty cache copies (controllers holding one are cloned per episode); a filled one is a bug."""
        if self:
            raise ValueError(f"an InteractionCache is copied only empty, this one holds {len(self)} interactions")
        new = InteractionCache()
        memo[id(self)] = new
        return new

    def __setitem__(self, key: str, value: InteractionWithTokenLogpReward) -> None:
        if value.messages is None:
            raise ValueError("an interaction needs its messages to find its parent")
        if value.parent is None:
            value.parent = self._parent_of(value.messages)
        super().__setitem__(key, value)

    def _parent_of(self, messages: list[dict]) -> InteractionWithTokenLogpReward | None:
        best, best_len = None, -1
        for earlier in self.values():
            if earlier.output_message_list is None:  # still in flight: no reply to extend yet
                continue
            before = earlier.messages + earlier.output_message_list
            if len(before) > best_len and messages[: len(before)] == before:
                best, best_len = earlier, len(before)
        return best

    @property
    def last_interaction_id(self) -> str:
        return next(reversed(self))

    @property
    def total_reward(self) -> float:
        return self._total_reward

    def set_reward(self, interaction_id: str, reward: float) -> None:
        with self._lock:
            inter = self[interaction_id]
            self._total_reward += reward - (inter.reward or 0.0)
            inter.reward = reward

    def set_last_reward(self, reward: float) -> None:
        self.set_reward(self.last_interaction_id, reward)

    def apply_reward_discount(self, turn_discount: float = 1.0) -> dict[str, InteractionWithTokenLogpReward]:
        """Backwards over call order: rᵢ += γ·rᵢ₊₁ (unset rewards count 0). Once per cache."""
        if self._discounted:
            raise RuntimeError("apply_reward_discount may be called once per cache")
        self._discounted = True
        later = 0.0
        for inter in reversed(list(self.values())):
            later = later * turn_discount + (inter.reward or 0.0)
            inter.reward = later
        return dict(self)

    def export_interactions(self, style: str, reward_discount: float | None = None) -> dict[str, InteractionWithTokenLogpReward]:
        """``individual``: every finished call; ``concat``: the finished calls no other extends
        (every call must then be ``chat_template_type="concat"``). ``reward_discount``: apply it first."""
        if style not in ("individual", "concat"):
            raise ValueError(f"style must be 'individual' or 'concat', got {style!r}")
        if reward_discount is not None and not self._discounted:
            self.apply_reward_discount(reward_discount)
        done: dict[str, InteractionWithTokenLogpReward] = {}
        for key, inter in self.items():
            if inter.interaction_id is None or inter.output_message_list is None:
                continue  # in flight when the workflow exported: not a finished call
            if inter.interaction_id != key:
                raise ValueError(f"interaction {inter.interaction_id!r} is filed under {key!r}")
            done[key] = inter
        if style == "individual":
            return done
        flat = [k for k, i in done.items() if i.chat_template_type != "concat"]
        if flat:
            raise ValueError(
                f"'concat' export needs every interaction's chat_template_type to be 'concat' ({flat[0]!r} is not): "
                "a template may add or drop tokens between turns; export 'individual' instead"
            )
        extended = {id(i.parent) for i in done.values() if i.parent is not None}
        return {k: i for k, i in done.items() if id(i) not in extended}
