"""The agentic demo's plumbing: the SFT mix of the embedded model's agentic variant, the built
variant's tool use (a share of well-formed calls, a share of malformed ones, answers given
unaided) and its config.

Not tested here: the accuracy RL reaches (emergent; ``benchmarks/agentic.py`` measures it; its
reading of a run's records is tested in benchmarks/tests/test_agentic.py).
The variant is built on first use (a few minutes; after that, a cache hit).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from paths import ROOT

import areal.train  # noqa: F401  (registers the schema with Hydra's ConfigStore)
from areal.embedded.agentic import MALFORMED, AgentModelConfig, ensure_agent_model, make_agent_conversations, probe_agent, tool_use
from areal.embedded.corpus import make_leveled_problems, split_of
from areal.gateway.parsers import parse_output
from areal.workflow.common import execute_tool_call

# The agentic variant may still be building when these tests start (CI builds it beside the test
# run, areal/embedded/agentic.py's lock): waiting for it counts against pytest's per-test timeout.
pytestmark = [pytest.mark.timeout(1800), pytest.mark.agent_model]

CONF = ROOT / "conf"


def _first_reply(conv: dict) -> dict:
    return next(m for m in conv["messages"] if m["role"] == "assistant")


def test_the_mix_has_each_branch_in_its_share_and_only_train_questions():
    c = AgentModelConfig(sft_conversations=4000)
    convs = make_agent_conversations(c)
    assert all(split_of(next(m for m in x["messages"] if m["role"] == "user")["content"]) == "train" for x in convs)
    tool = [x for x in convs if x["tools"]]
    assert abs(1 - len(tool) / len(convs) - c.plain_share) < 0.03
    first = [_first_reply(x) for x in tool]
    skipped = sum(not m.get("tool_calls") and "<tool_call>" not in m["content"] for m in first) / len(first)
    malformed = sum("<tool_call>" in m["content"] for m in first) / len(first)
    assert abs(skipped - c.skip_share) < 0.03
    assert abs(malformed - (1 - c.skip_share) * c.malformed_share) < 0.03
    used = [x for x in tool if x["messages"][-1]["content"].startswith("The calculator says")]
    after_result = [x for x in tool if x["messages"][-2]["role"] == "tool" and not x["messages"][-2]["content"].startswith("error")]
    assert abs(len(used) / len(after_result) - c.use_result_share) < 0.04


def test_calls_parse_malformed_calls_do_not_and_tool_errors_are_the_agents_own():
    for conv in make_agent_conversations(AgentModelConfig(sft_conversations=2000)):
        msgs = conv["messages"]
        for i, m in enumerate(msgs):
            if m["role"] == "assistant" and m.get("tool_calls"):
                args = m["tool_calls"][0]["function"]["arguments"]
                text = '<tool_call>\n{"name": "calculator", "arguments": ' + json.dumps(args) + "}\n</tool_call>"
                (call,) = parse_output(text, "qwen25", None).tool_calls
                assert msgs[i + 1]["content"] == execute_tool_call(call.name, call.arguments)  # the result the agent gives
    for form in MALFORMED:
        parsed = parse_output(form.format(e="23*7"), "qwen25", None)
        assert parsed.tool_calls == [] and "<tool_call>" in parsed.content


def test_tool_use_statistics_of_one_episode():
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "23*7"}}\n</tool_call>'
    good = tool_use([call, "The calculator says 161. \\boxed{161}"], ["161"], "The calculator says 161. \\boxed{161}")
    assert good == {"calls": 1.0, "malformed": 0.0, "tool_errors": 0.0, "used_result": 1.0, "answered_unaided": 0.0}
    ignored = tool_use([call, "23 * 7 = 151. \\boxed{151}"], ["161"], "23 * 7 = 151. \\boxed{151}")
    assert ignored["used_result"] == 0.0 and ignored["calls"] == 1.0
    broken = tool_use([MALFORMED[0].format(e="23*7")], [], MALFORMED[0].format(e="23*7"))
    assert broken["malformed"] == 1.0 and broken["calls"] == 0.0
    recovered = tool_use(["x", call, "\\boxed{161}"], ["error: invalid syntax", "161"], "\\boxed{161}")
    assert recovered["tool_errors"] == 1.0 and recovered["calls"] == 2.0 and recovered["used_result"] == 1.0
    unaided = tool_use(["7 + 2 = 9. \\boxed{9}"], [], "7 + 2 = 9. \\boxed{9}")
    assert unaided["answered_unaided"] == 1.0


@pytest.fixture(scope="module")
def agent_model() -> Path:
    return ensure_agent_model(progress=False)


def test_the_built_variant_uses_the_tool_unreliably(agent_model):
    """The build contract, on the built weights, with bounds any build meets: of 120 held-out
    episodes (the agent's loop, sampled at temperature 1), some make well-formed calls, some
    malformed ones, some answer unaided, some use a tool result; and it is neither always right
    nor never right, so RL has groups to learn from."""
    import torch
    from transformers import AutoModelForCausalLM

    from areal.embedded.tokenizer import load_tokenizer

    torch.set_num_threads(1)
    tok = load_tokenizer(agent_model)
    model = AutoModelForCausalLM.from_pretrained(str(agent_model)).eval()
    r = probe_agent(model, tok, make_leveled_problems("test", 120, seed=7), seed=7)
    assert 0.2 <= r["calls"] <= 1.5, r
    assert 0.03 <= r["malformed"] <= 0.6, r
    assert 0.05 <= r["answered_unaided"] <= 0.7, r
    assert 0.03 <= r["used_result"] <= 0.9, r
    assert 0.05 <= r["accuracy"] <= 0.85, r
    info = json.loads((agent_model / "build_info.json").read_text())
    assert info["probe"]["malformed"] > 0 and info["probe"]["calls"] > 0


def test_the_agentic_config_trains_the_calculator_agent_on_the_variant(agent_model):
    from areal.utils.hf_utils import resolve_model_path

    with initialize_config_dir(str(CONF), version_base=None):
        config = OmegaConf.to_object(compose(config_name="agentic"))
        single = OmegaConf.to_object(compose(config_name="config"))
    assert config.model.path == "embedded-agent" and config.rollout.agent == "agents/openai_tools.py:CalculatorAgent"
    assert single.model.path == "embedded" and single.rollout.agent.endswith("MathAgent")  # the single-turn task stays
    assert Path(resolve_model_path("embedded-agent")) == agent_model
