"""The embedded default model: tokenizer, chat template, task/reward, cache, and the model itself.

The session fixture uses the real cache (the set-up command builds it before the tests run).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from paths import ROOT
from transformers import AutoModelForCausalLM, AutoTokenizer

import areal.embedded as embedded
from areal.embedded import EmbeddedConfig, ensure_embedded_model, read_build_info
from areal.embedded.build import tokenize_conversations
from areal.embedded.corpus import (
    CALCULATOR_TOOL,
    extract_boxed,
    make_conversation,
    make_leveled_problems,
    make_problems,
    make_sft_conversations,
    math_reward,
)
from areal.embedded.tokenizer import ADDED_TOKENS, SPECIAL_TOKENS


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return ensure_embedded_model(progress=False)


@pytest.fixture(scope="session")
def tok(model_dir: Path):
    return AutoTokenizer.from_pretrained(str(model_dir))


def test_special_tokens_are_single_ids_and_im_end_is_eos(tok, model_dir: Path) -> None:
    ids = set()
    for t in SPECIAL_TOKENS + ADDED_TOKENS:
        enc = tok.encode(t, add_special_tokens=False)
        assert len(enc) == 1, (t, enc)
        assert tok.decode(enc) == t
        ids.add(enc[0])
    assert len(ids) == len(SPECIAL_TOKENS) + len(ADDED_TOKENS)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == im_end
    assert tok.pad_token == "<|endoftext|>"
    gen = json.loads((model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == im_end
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["tie_word_embeddings"] is True
    assert cfg["vocab_size"] >= len(tok)
    assert (model_dir / "model.safetensors").is_file()


def test_tokenizer_round_trips_corpus_text_and_splits_digits(tok) -> None:
    convs = make_sft_conversations(60, seed=3, tool_share=0.3, retry_share=0.3)
    for conv in convs:
        text = tok.apply_chat_template(conv["messages"], tools=conv["tools"], tokenize=False)
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
    odd = "Ünïcode ✓ 🙂 tabs\tand\r\nnewlines  {}"
    assert tok.decode(tok.encode(odd, add_special_tokens=False)) == odd
    digits = tok.convert_ids_to_tokens(tok.encode("1234567890", add_special_tokens=False))
    assert digits == list("1234567890")


def test_chat_template_renders_user_with_generation_prompt(tok) -> None:
    msgs = [{"role": "user", "content": "What is 2 plus 3?"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nWhat is 2 plus 3?<|im_end|>\n<|im_start|>assistant\n"
    enc = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    assert list(enc["input_ids"]) == tok.encode(text, add_special_tokens=False)
    with_system = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, *msgs], tokenize=False)
    assert with_system == "<|im_start|>system\nBe brief.<|im_end|>\n" + text.split("<|im_start|>assistant")[0]


def test_chat_template_renders_tools_tool_calls_and_tool_role(tok) -> None:
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "23*7"}}}
    msgs = [
        {"role": "user", "content": "What is 23 times 7?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "161"},
        {"role": "tool", "content": "ok"},
        {"role": "assistant", "content": "23 * 7 = 161. \\boxed{161}"},
    ]
    text = tok.apply_chat_template(msgs, tools=[CALCULATOR_TOOL], tokenize=False)
    assert text.startswith("<|im_start|>system\n# Tools\n\nYou may call one or more functions")
    assert "<tools>\n" + json.dumps(CALCULATOR_TOOL, ensure_ascii=False) + "\n</tools>" in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "23*7"}}\n</tool_call><|im_end|>\n' in text
    )
    # Consecutive tool results share one user turn, Qwen2.5-style.
    assert "<|im_start|>user\n<tool_response>\n161\n</tool_response>\n<tool_response>\nok\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n23 * 7 = 161. \\boxed{161}<|im_end|>\n")
    # OpenAI-style arguments (a JSON string) render the same as a dict.
    as_string = {"type": "function", "function": {"name": "calculator", "arguments": '{"expression": "23*7"}'}}
    msgs[1] = {"role": "assistant", "content": None, "tool_calls": [as_string]}
    assert tok.apply_chat_template(msgs, tools=[CALCULATOR_TOOL], tokenize=False) == text
    ids = tok.encode(text, add_special_tokens=False)
    for marker in ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"):
        assert ids.count(tok.convert_tokens_to_ids(marker)) == text.count(marker)


@pytest.mark.parametrize("kind", ["plain", "tool", "retry"])
def test_generation_prompt_is_a_prefix_of_the_continued_conversation(tok, kind: str) -> None:
    rng = random.Random(0)
    for p in make_leveled_problems("train", 10, seed=5):
        conv = make_conversation(rng, p, kind)
        msgs, tools = conv["messages"], conv["tools"]
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            prompt = tok.apply_chat_template(msgs[:i], tools=tools, tokenize=False, add_generation_prompt=True)
            full = tok.apply_chat_template(msgs[: i + 1], tools=tools, tokenize=False)
            assert full.startswith(prompt)
            prompt_ids = tok.encode(prompt, add_special_tokens=False)
            assert tok.encode(full, add_special_tokens=False)[: len(prompt_ids)] == prompt_ids


def test_sft_labels_cover_exactly_the_trained_assistant_turns(tok) -> None:
    rng = random.Random(1)
    p = make_leveled_problems("train", 1, seed=9)[0]
    convs = [make_conversation(rng, p, k) for k in ("plain", "tool", "retry")]
    examples = tokenize_conversations(tok, convs)
    plain_ids, plain_labels = examples[0]
    rl_prompt = tok.apply_chat_template([{"role": "user", "content": p.question}], tokenize=True, add_generation_prompt=True)["input_ids"]
    # The SFT sample is the RL prompt followed by the trained reply: same tokens, same rendering.
    assert plain_ids[: len(rl_prompt)] == list(rl_prompt)
    trained = tok.decode([t for t in plain_labels if t != -100])
    assert trained == f"{convs[0]['messages'][1]['content']}<|im_end|>"
    _, retry_labels = examples[2]
    retry_trained = tok.decode([t for t in retry_labels if t != -100])
    assert retry_trained == f"{convs[2]['messages'][3]['content']}<|im_end|>"  # wrong try untrained
    _, tool_labels = examples[1]
    assert tok.decode([t for t in tool_labels if t != -100]).count("<|im_end|>") == 2
    # With prompt loss everything is trained except the retry's deliberate wrong answer.
    ids, labels = tokenize_conversations(tok, convs[2:], prompt_loss=True)[0]
    untrained = tok.decode([t for t, y in zip(ids, labels) if y == -100])
    assert untrained == f"{convs[2]['messages'][1]['content']}<|im_end|>"


def test_extract_boxed_edge_cases() -> None:
    assert extract_boxed("no box here") is None
    assert extract_boxed("\\boxed{42}") == "42"
    assert extract_boxed("\\boxed{1} then \\boxed{2}") == "2"
    assert extract_boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_boxed("\\boxed{7} and a truncated \\boxed{12") == "7"
    assert extract_boxed("\\boxed{}") == ""


def test_math_reward_edge_cases() -> None:
    for good in ("\\boxed{42}", "\\boxed{42.0}", "\\boxed{ 42 }", "x = 41. \\boxed{42}", "\\boxed{+42}"):
        assert math_reward(good, "42") == 1.0, good
    for bad in ("42", "\\boxed{41}", "\\boxed{42} \\boxed{43}", "\\boxed{forty-two}", "\\boxed{}", ""):
        assert math_reward(bad, "42") == 0.0, bad
    assert math_reward("\\boxed{0}", "0") == 1.0
    assert math_reward("\\boxed{1,024}", "1024") == 1.0


def test_splits_are_disjoint_deterministic_and_mixed() -> None:
    train = make_problems("train", 2000, seed=0)
    test = make_problems("test", 500, seed=0)
    assert {r["question"] for r in train}.isdisjoint({r["question"] for r in test})
    assert make_problems("test", 500, seed=0) == test
    assert make_problems("test", 500, seed=1) != test
    assert len({r["question"] for r in test}) == 500
    for r in train[:200]:
        assert set(r) == {"question", "answer"} and str(int(r["answer"])) == r["answer"]
    levels = {p.level for p in make_leveled_problems("test", 200)}
    assert levels == {1, 2, 3, 4}
    with pytest.raises(ValueError, match="split"):
        make_problems("valid", 1)


def test_cache_hit_returns_same_path_without_rebuilding(model_dir: Path) -> None:
    weights = model_dir / "model.safetensors"
    mtime, count = weights.stat().st_mtime_ns, embedded.build_count
    again = ensure_embedded_model(progress=False)
    assert again == model_dir
    assert embedded.build_count == count
    assert weights.stat().st_mtime_ns == mtime
    assert read_build_info(model_dir)["key"] == model_dir.name


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="hidden_size"):
        EmbeddedConfig(hidden_size=0)
    with pytest.raises(ValueError, match="warmup_steps"):
        EmbeddedConfig(sft_steps=10, warmup_steps=10)


def test_model_greedily_solves_an_easy_test_problem(tok, model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    assert model.dtype == torch.float32
    easy = [p for p in make_leveled_problems("test", 60) if p.level == 1][:10]
    correct = 0
    for p in easy:
        ids = tok.apply_chat_template([{"role": "user", "content": p.question}], add_generation_prompt=True, return_tensors="pt")[
            "input_ids"
        ]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=64, do_sample=False)
        text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        correct += math_reward(text, p.answer) == 1.0
    assert correct >= 1


_TINY = dict(
    tokenizer_conversations=300,
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    sft_conversations=300,
    sft_steps=3,
    warmup_steps=1,
    batch_size=8,
    eval_problems=0,
    num_threads=1,
)


def test_concurrent_builders_produce_one_complete_directory(tmp_path: Path) -> None:
    code = (
        "import json, sys, areal.embedded as e\n"
        f"p = e.ensure_embedded_model(sys.argv[1], progress=False, config=e.EmbeddedConfig(**{_TINY!r}))\n"
        "print(json.dumps({'path': str(p), 'built': e.build_count}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, env=env) for _ in range(2)]
    results = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert results[0]["path"] == results[1]["path"]
    assert sorted(r["built"] for r in results) == [0, 1]  # the second found the first's result
    built = Path(results[0]["path"])
    assert [d.name for d in tmp_path.iterdir() if d.is_dir()] == [built.name]  # no temp dirs left
    AutoTokenizer.from_pretrained(str(built))
    AutoModelForCausalLM.from_pretrained(str(built))
