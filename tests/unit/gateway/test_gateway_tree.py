"""Conversation tree: rewards, discounting along root-to-leaf paths, individual and concat export."""

from __future__ import annotations

import pytest
import torch

from areal.gateway import tree
from areal.gateway.tree import Interaction


def _inter(iid: str, prompt: list[int], out: list[int], parent: str | None = None, version: int = 1) -> Interaction:
    return Interaction(
        id=iid,
        prompt_ids=prompt,
        output_ids=out,
        output_logprobs=[-0.1 * (k + 1) for k in range(len(out))],
        version=version,
        finish_reason="stop",
        created=0.0,
        parent_id=parent,
    )


def _chain() -> dict[str, Interaction]:
    a = _inter("a", [1, 2], [3, 4])
    b = _inter("b", [1, 2, 3, 4, 5], [6], parent="a", version=2)
    c = _inter("c", [1, 2, 3, 4, 5, 6, 7, 8], [9, 10], parent="b", version=3)
    return {i.id: i for i in (a, b, c)}


def test_three_turn_chain_discount_exact():
    inters = _chain()
    assert tree.set_final_reward(inters, 2.0) == "c"
    tree.apply_reward_discount(inters, 0.9)
    assert [inters[k].reward for k in "abc"] == pytest.approx([1.62, 1.8, 2.0])


def test_discount_adds_own_rewards_and_averages_branches():
    inters = _chain()
    inters["d"] = _inter("d", [1, 2, 3, 4, 9], [1], parent="a")
    tree.set_reward(inters, "a", 0.5)
    tree.set_reward(inters, "c", 1.0)
    tree.set_reward(inters, "d", 3.0)
    tree.apply_reward_discount(inters, 0.5)
    assert inters["b"].reward == pytest.approx(0.5)
    assert inters["a"].reward == pytest.approx(0.5 + 0.5 * (0.5 + 3.0) / 2)
    with pytest.raises(KeyError):
        tree.set_reward(inters, "nope", 1.0)
    with pytest.raises(TypeError):
        tree.set_reward(inters, "a", "high")


def test_individual_export_tensors():
    inters = _chain()
    tree.set_final_reward(inters, 1.0)
    rows = tree.export_interactions(inters, "individual")
    assert list(rows) == ["a", "b", "c"]
    t = rows["b"].to_tensor_dict()
    assert set(t) == {"input_ids", "loss_mask", "logprobs", "versions", "attention_mask", "rewards"}
    assert t["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6]]
    assert t["loss_mask"].tolist() == [[0, 0, 0, 0, 0, 1]]
    assert t["versions"].tolist() == [[-1, -1, -1, -1, -1, 2]]
    assert t["logprobs"][0, -1].item() == pytest.approx(-0.1)
    assert t["attention_mask"].shape == (1, 6) and t["attention_mask"].all()
    assert rows["b"].reward == 0.0 and rows["c"].to_tensor_dict()["rewards"].tolist() == [1.0]
    assert t["input_ids"].dtype == torch.long


def test_concat_export_merges_each_chain_masking_later_prompts():
    inters = _chain()
    inters["d"] = _inter("d", [1, 2, 3, 4, 9], [11], parent="a")  # a branch off the root
    tree.set_final_reward(inters, 1.0)
    rows = tree.export_interactions(inters, "concat")
    assert sorted(rows) == ["c", "d"]
    c = rows["c"]
    assert c.input_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert c.loss_mask == [0, 0, 1, 1, 0, 1, 0, 0, 1, 1]  # sampled tokens of every turn, nothing else
    assert c.versions == [-1, -1, 1, 1, -1, 2, -1, -1, 3, 3]
    assert c.logprobs[2:4] == pytest.approx([-0.1, -0.2]) and c.logprobs[4] == 0.0
    assert rows["d"].input_ids == [1, 2, 3, 4, 9, 11] and rows["d"].reward == 1.0  # d is the last call
    with pytest.raises(ValueError):
        tree.export_interactions(inters, "tree")


def test_concat_refuses_a_child_that_does_not_extend_its_parent():
    inters = _chain()
    inters["c"].prompt_ids = [1, 2, 3, 99, 5, 6]
    with pytest.raises(ValueError, match="does not extend"):
        tree.export_interactions(inters, "concat")
