"""The AReaL import paths and signatures of the design documents, each exercised for real:
reward pool with real processes, config loading from real YAML files, the embedded tokenizer and
dataset, and every SDK's math agent against a real gateway on the embedded engine."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import warnings
from pathlib import Path

import pytest
from run_checks import run_in_repo

from areal.api.cli_args import AgentRLConfig, AReaLKeysIgnored, GenerationHyperparameters, GRPOConfig, load_expr_config
from areal.api.reward_api import AsyncRewardWrapper, RewardTimeoutError, RewardWorkerError
from areal.api.workflow_api import AgentWorkflow, RolloutWorkflow, workflow_kind
from areal.reward.gsm8k import gsm8k_reward_fn
from areal.reward.math_verify import answers_equal, extract_answer, math_equal
from areal.utils.dynamic_import import import_from_string

# ---- import_from_string -------------------------------------------------------------------------


def test_import_from_string_resolves_dotted_and_colon_paths():
    assert import_from_string("areal.reward.gsm8k.gsm8k_reward_fn") is gsm8k_reward_fn
    assert import_from_string("areal.reward.gsm8k:gsm8k_reward_fn") is gsm8k_reward_fn
    assert import_from_string("areal.api.cli_args.GenerationHyperparameters.new") is GenerationHyperparameters.new
    with pytest.raises(ImportError, match="no attribute 'nope'"):
        import_from_string("areal.reward.gsm8k.nope")
    with pytest.raises(ImportError, match="no module"):
        import_from_string("no_such_package_xyz.fn")


# ---- math verification -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a,b",
    [
        ("1,000", "1000"),
        ("0.5", "1/2"),
        ("\\frac{1}{2}", "0.5"),
        ("\\dfrac{3}{4}", "0.75"),
        ("\\frac12", "0.5"),
        ("$1,000.00$", "1000"),
        ("50\\%", "50"),
        ("x = 3", "3"),
        ("\\sqrt{4}", "2"),
        ("2x+x", "3x"),
        ("-7", "-7.0"),
        ("1e3", "1000"),
        ("72.", "72"),
    ],
)
def test_equivalent_answers_are_equal(a, b):
    assert answers_equal(a, b)


@pytest.mark.parametrize("a,b", [("1,5", "15"), ("7", "8"), ("0.5", "0.55"), ("x", "y"), ("", "0"), ("\\frac{1}{3}", "0.3")])
def test_different_answers_are_not_equal(a, b):
    assert not answers_equal(a, b)


def test_extraction_prefers_boxed_then_gsm8k_marker_then_answer_is_then_last_number():
    assert extract_answer("3 + 4 = 7. \\boxed{7} and 9") == "7"
    assert extract_answer("work 1 2 #### 1,234") == "1,234"
    assert extract_answer("so the answer is 12. Done 5") == "12"
    assert extract_answer("we get 3 then 41") == "41"
    assert extract_answer("no numbers") is None


def test_gsm8k_reward_fn_takes_both_documented_call_styles():
    assert gsm8k_reward_fn(None, "5 + 3 = 8. \\boxed{8}", None, None, "8") == 1.0
    assert gsm8k_reward_fn(completions="\\boxed{\\frac{1}{2}}", answer="0.5", prompt=None, prompt_ids=None, completion_ids=None) == 1.0
    assert gsm8k_reward_fn(result="\\boxed{9}", answer="Natalia sold 48/2 = 24 clips.\n#### 9") == 1.0
    assert gsm8k_reward_fn(completions="\\boxed{10}", answer="9") == 0.0
    assert math_equal("The answer is 1,000.", "1000")


# ---- AsyncRewardWrapper: a real process pool ---------------------------------------------------------


def slow_reward(seconds: float) -> float:
    time.sleep(seconds)
    return 1.0


def crashing_reward(marker: str) -> float:
    """Kills its worker process the first time (no marker file yet); succeeds afterwards."""
    if not os.path.exists(marker):
        Path(marker).write_text("crashed once")
        os._exit(3)
    return 0.5


def always_crashing_reward() -> float:
    os._exit(4)


def raising_reward(completions: str, answer: str) -> float:
    raise ValueError(f"bad answer format {answer!r}")


def worker_pid() -> int:
    return os.getpid()


def test_reward_runs_in_another_process_and_returns_a_float():
    wrapper = AsyncRewardWrapper(gsm8k_reward_fn)
    assert asyncio.run(wrapper(completions="\\boxed{8}", answer="8")) == 1.0
    pid = asyncio.run(AsyncRewardWrapper(worker_pid)())
    assert pid != os.getpid()


def test_a_slow_reward_times_out_is_retried_then_raises_or_scores_the_timeout_reward():
    wrapper = AsyncRewardWrapper(slow_reward, timeout_seconds=0.3, max_retries=1, max_workers=1)
    with pytest.raises(RewardTimeoutError, match="on all 2 attempts"):
        asyncio.run(wrapper(5.0))
    lenient = AsyncRewardWrapper(slow_reward, timeout_seconds=0.3, max_retries=0, max_workers=1, timeout_reward=0.0)
    assert asyncio.run(lenient(5.0)) == 0.0
    # The killed worker's pool was replaced: a fast call on the same wrapper succeeds.
    assert asyncio.run(wrapper(0.0)) == 1.0


def test_a_crashed_worker_is_replaced_and_the_call_retried(tmp_path):
    wrapper = AsyncRewardWrapper(crashing_reward, max_retries=1, max_workers=1)
    assert asyncio.run(wrapper(str(tmp_path / "marker"))) == 0.5
    assert (tmp_path / "marker").exists()
    with pytest.raises(RewardWorkerError, match="died on all 2 attempts"):
        asyncio.run(AsyncRewardWrapper(always_crashing_reward, max_retries=1, max_workers=1)())


def test_a_reward_function_error_propagates_unretried():
    with pytest.raises(ValueError, match="bad answer format"):
        asyncio.run(AsyncRewardWrapper(raising_reward)(completions="x", answer="y"))


def test_concurrent_calls_share_the_pool():
    wrapper = AsyncRewardWrapper(gsm8k_reward_fn, max_workers=2)

    async def many() -> list[float]:
        return await asyncio.gather(*(wrapper(completions=f"\\boxed{{{i}}}", answer=str(i % 2)) for i in range(8)))

    assert asyncio.run(many()) == [1.0, 1.0] + [0.0] * 6


# ---- config ---------------------------------------------------------------------------------------------


def test_load_expr_config_yaml_overrides_interpolation_and_subclass(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        "experiment_name: exp\ntokenizer_path: ${actor.path}\nactor:\n  path: embedded\n  optimizer:\n    lr: 2.0e-5\n"
        "gconfig:\n  n_samples: 4\n  max_tokens: 8192\n  temperature: 1.0\n"
        "agent_builder_path: areal.workflow.openai_agent.math_agent.build_math_agent\nagent_builder_kwargs: {}\n"
    )
    config, path = load_expr_config(
        [
            "--config",
            str(cfg_file),
            "trial_name=t7",
            "actor.optimizer.lr=1e-5",
            "gconfig.n_samples=2",
            "rollout.openai.mode=inline",
            "agent_builder_kwargs.k=3",
        ],
        AgentRLConfig,
    )
    assert path == str(cfg_file)
    assert (config.experiment_name, config.trial_name, config.tokenizer_path) == ("exp", "t7", "embedded")
    assert config.actor.optimizer.lr == 1e-5 and isinstance(config.actor.optimizer.lr, float)
    assert config.gconfig.n_samples == 2 and config.rollout.openai.mode == "inline"
    assert config.agent_builder_kwargs == {"k": 3} and config.reward_fn_path == "areal.reward.gsm8k.gsm8k_reward_fn"


# The online-mode keys of AReaL's openclaw and hermes example configs (the older and the newer place
# of the admin key, and the keys of AReaL's v2 stack that mean nothing here), with their placeholders.
ONLINE_EXAMPLES = {
    "openclaw": "rollout:\n  openai:\n    mode: online\n    tool_call_parser: qwen\n    admin_api_key: sk-test123456\n",
    "hermes": "rollout:\n  _version: v2\n  agent:\n    mode: online\n    export_style: individual\n"
    "  admin_api_key: sk-xxx\nactor:\n  _version: v2\n  admin_api_key: gsm8k-123\n",
}


@pytest.mark.parametrize(("example", "override"), [("openclaw", "rollout.agent.admin_api_key"), ("hermes", "rollout.admin_api_key")])
def test_areal_online_example_configs_load_with_the_admin_key_their_readmes_pass(tmp_path, example, override):
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text("experiment_name: online-rl\ntrial_name: trial0\n" + ONLINE_EXAMPLES[example])
    with pytest.raises(ValueError, match=r"admin_api_key must be at least 16 characters"):  # the placeholder
        load_expr_config(["--config", str(cfg_file)], GRPOConfig)
    key = "sk-admin-" + "0" * 16
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        config, _ = load_expr_config(["--config", str(cfg_file), f"{override}={key}"], GRPOConfig)
    named = " ".join(str(w.message) for w in warned if issubclass(w.category, AReaLKeysIgnored))
    if example == "hermes":  # AReaL's v2 stack's actor keys, named as having no effect here; rollout._version has one
        assert all(k in named for k in ("actor._version", "actor.admin_api_key")) and "rollout._version" not in named, named
    assert config.rollout._version == ("v2" if example == "hermes" else "")  # its gateway answers a start 201 (docs/online.md)
    assert config.rollout.openai.mode == "online"
    assert (config.rollout.openai.admin_api_key or config.rollout.admin_api_key) == key


def test_the_ignored_keys_warning_survives_being_rebuilt_from_its_message():
    """pytest-xdist carries a worker's warnings to the controller as ``cls(*args)``: a warning
    that cannot be rebuilt so crashed the whole test run."""
    warning = AReaLKeysIgnored({"sglang": "start servers yourself", "saver": "final/ is saved"})
    again = AReaLKeysIgnored(*warning.args)
    assert str(again) == str(warning) and "sglang: start servers yourself" in str(again)


def test_unknown_keys_and_bad_values_are_errors_naming_them(tmp_path):
    with pytest.raises(ValueError, match="actor.optimzer"):
        load_expr_config(["actor.optimzer.lr=1"], GRPOConfig)
    with pytest.raises(ValueError, match="agent_builder_path"):
        load_expr_config(["agent_builder_path=x"], GRPOConfig)  # only AgentRLConfig has it
    with pytest.raises(ValueError, match="rollout.openai.mode"):
        load_expr_config(["rollout.openai.mode=docker"], GRPOConfig)
    with pytest.raises(ValueError, match="scheduler.type"):
        load_expr_config(["scheduler.type=slurm"], GRPOConfig)
    with pytest.raises(ValueError, match="gconfig.n_samples"):
        load_expr_config(["gconfig.n_samples=0"], GRPOConfig)
    with pytest.raises(FileNotFoundError):
        load_expr_config(["--config", str(tmp_path / "missing.yaml")], GRPOConfig)


def test_generation_hyperparameters_add_stop_and_pad_ids_of_the_real_tokenizer():
    from areal.utils.hf_utils import load_hf_tokenizer

    tok = load_hf_tokenizer("embedded")
    g = GenerationHyperparameters(n_samples=2, max_tokens=512, temperature=0.7)
    g2 = g.new_with_stop_and_pad_token_ids(tok)
    assert tok.eos_token_id in g2.stop_token_ids and tok.pad_token_id in g2.stop_token_ids
    assert g.stop_token_ids == [] and (g2.n_samples, g2.max_tokens, g2.temperature) == (2, 512, 0.7)
    assert g.to_openai_args_dict()["temperature"] == 0.7 and g.new(greedy=True).to_openai_args_dict()["temperature"] == 0.0


def test_custom_dataset_embedded_and_jsonl(tmp_path):
    from areal.api.cli_args import DatasetConfig
    from areal.dataset import EmbeddedDataset, get_custom_dataset
    from areal.utils.hf_utils import load_hf_tokenizer

    tok = load_hf_tokenizer("embedded")
    train = get_custom_dataset(split="train", dataset_config=DatasetConfig(size=20), tokenizer=tok)
    test = get_custom_dataset(split="test", dataset_config=DatasetConfig(size=10), tokenizer=tok)
    assert isinstance(train, EmbeddedDataset) and len(train) == 20 and len(test) == 10
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    assert train[0]["messages"][-1]["content"] == train[0]["question"] and train[0]["answer"].isdigit()
    f = tmp_path / "train.jsonl"
    f.write_text(
        '{"question": "What is 2 plus 3?", "answer": "#### 5"}\n{"messages": [{"role": "user", "content": "What is 4 times 4?"}], "answer": "16"}\n'
    )
    rows = get_custom_dataset(split="train", dataset_config=DatasetConfig(path=str(tmp_path)), tokenizer=tok)
    assert [r["question"] for r in rows] == ["What is 2 plus 3?", "What is 4 times 4?"]
    assert rows[0]["messages"] == [{"role": "user", "content": "What is 2 plus 3?"}]
    assert len(get_custom_dataset(split="train", dataset_config=DatasetConfig(path=str(f), max_length=200), tokenizer=tok)) == 2
    with pytest.raises(ValueError, match="no rows left"):
        get_custom_dataset(split="train", dataset_config=DatasetConfig(path=str(f), max_length=3), tokenizer=tok)
    with pytest.raises(FileNotFoundError, match="nothing here downloads"):
        get_custom_dataset(split="train", dataset_config=DatasetConfig(path="openai/gsm8k"))


# ---- workflows and the trainer's mapping ---------------------------------------------------------------------


class NoArgAgent(AgentWorkflow):
    async def run(self, data, **extra_kwargs):
        return 1.0


class ArgAgent(AgentWorkflow):
    def __init__(self, scale: float):
        self.scale = scale

    async def run(self, data, **extra_kwargs):
        return self.scale


class EchoRollout(RolloutWorkflow):
    async def arun_episode(self, engine, data):
        return {}


def test_workflow_plans_pick_an_agent_spec_when_the_class_can_be_rebuilt():
    from areal.experimental.trainer import plan_workflow

    p = plan_workflow("areal.workflow.openai.math_agent.MathAgent")
    assert (p.spec, p.obj, p.kind) == ("areal.workflow.openai.math_agent:MathAgent", None, "agent")
    assert plan_workflow(NoArgAgent()).spec == f"{__name__}:NoArgAgent"
    obj = ArgAgent(2.0)
    assert plan_workflow(obj).obj is obj
    assert plan_workflow(ArgAgent, {"scale": 3.0}).obj.scale == 3.0
    assert plan_workflow(EchoRollout()).kind == "rollout" and plan_workflow(EchoRollout()).spec is None
    assert workflow_kind(NoArgAgent().run) == "agent"
    with pytest.raises(TypeError, match="not a workflow"):
        workflow_kind(object())


def test_areal_config_maps_onto_the_controllers_train_config():
    from areal.experimental.trainer import to_train_config

    config, _ = load_expr_config(
        [
            "gconfig.n_samples=3",
            "train_dataset.batch_size=2",
            "total_train_epochs=2",
            "actor.optimizer.lr=1e-5",
            "rollout.openai.mode=inline",
            "gconfig.max_new_tokens=48",
            "rollout.openai.tool_call_parser=hermes",
            "actor.mb_spec.max_tokens_per_mb=512",
        ],
        GRPOConfig,
    )
    t = to_train_config(config, "areal.workflow.openai.math_agent:MathAgent", n_train=7, n_eval=5, embedded_data=True)
    assert (t.rollout.n_samples, t.rollout.groups_per_step, t.rollout.openai.mode) == (3, 2, "inline")
    assert t.trainer.steps == 2 * 4 and t.trainer.lr == 1e-5 and t.trainer.micro_batch_tokens == 512
    assert (t.data.train_size, t.data.eval_size) == (7, 5) and t.gateway.default_max_tokens == 48
    assert t.gateway.tool_parser == "hermes" and t.rollout.agent == "areal.workflow.openai.math_agent:MathAgent"
    assert not t.rollout.dynamic_sampling and t.rollout.overlong_penalty_tokens == 0 and t.trainer.clip_eps_high is None


def test_areals_dapo_keys_are_honoured():
    """AReaL's DAPO keys reach the settings that do the same here (docs/algorithms.md)."""
    from areal.experimental.trainer import to_train_config

    dapo = ["actor.dynamic_sampling=true", "actor.eps_clip_higher=0.28", "actor.mask_no_eos_with_zero=true"]
    dapo += ["actor.overlong_reward_penalty=true", "actor.overlong_tokens=16", "actor.overlong_penalty_factor=0.5"]
    config, _ = load_expr_config(dapo, GRPOConfig)
    t = to_train_config(config, "areal.workflow.openai.math_agent:MathAgent", n_train=7, n_eval=5, embedded_data=True)
    assert t.rollout.dynamic_sampling and t.rollout.overlong_filter and t.trainer.clip_eps_high == 0.28
    assert (t.rollout.overlong_penalty_tokens, t.rollout.overlong_penalty_factor) == (16, 0.5)
    with pytest.raises(ValueError, match="actor.overlong_tokens"):
        load_expr_config(["actor.overlong_reward_penalty=true"], GRPOConfig)


# ---- the launcher's environment ----------------------------------------------------------------------------


@pytest.mark.e2e
def test_local_launcher_runs_the_script_with_config_overrides_and_env(tmp_path):

    script = tmp_path / "show.py"
    script.write_text(
        "import os, sys, json\nprint(json.dumps({'argv': sys.argv[1:], 'env': {k: os.environ.get(k) for k in "
        "('AREAL_LAUNCHER', 'AREAL_EXPERIMENT_NAME', 'AREAL_TRIAL_NAME', 'AREAL_RUN_DIR', 'WORLD_SIZE', 'RANK')}}))\n"
        "sys.exit(7)\n"
    )
    cfg = tmp_path / "c.yaml"
    cfg.write_text("experiment_name: from-yaml\ncluster:\n  fileroot: /tmp/x\n")
    out = run_in_repo([sys.executable, "-m", "areal.launcher.local", str(script), "--config", str(cfg), "trial_name=t1"], timeout_s=60)
    assert out.returncode == 7, out.stderr
    import json

    shown = json.loads(out.stdout)
    assert shown["argv"] == ["--config", str(cfg), "trial_name=t1", "scheduler.type=local"]
    assert shown["env"] == {
        "AREAL_LAUNCHER": "local",
        "AREAL_EXPERIMENT_NAME": "from-yaml",
        "AREAL_TRIAL_NAME": "t1",
        "AREAL_RUN_DIR": "/tmp/x/from-yaml/t1",
        "WORLD_SIZE": "1",
        "RANK": "0",
    }


# ---- every SDK's math agent against a real gateway on the embedded engine -------------------------------


@pytest.mark.parametrize(
    "path,min_calls",
    [
        ("areal.workflow.openai.math_agent.MathAgent", 1),
        ("areal.workflow.openai.math_agent.MathToolAgent", 2),
        ("areal.workflow.langchain.math_agent.MathAgent", 1),
        ("areal.workflow.langchain.math_agent.MathToolAgent", 2),
        ("areal.workflow.anthropic.math_agent.MathAgent", 1),
        ("areal.workflow.openai_agent.math_agent.MathAgent", 1),
        ("areal.workflow.openai_agent.math_agent.MathToolAgent", 2),
    ],
)
def test_sdk_agent_runs_on_the_gateway_and_returns_the_verified_reward(served, path, min_calls):
    """Greedy, on problems the embedded model answers: every call is recorded with the engine's
    tokens, tool agents really execute the calculator call the model makes, and the reward is
    the verifier's verdict on the final answer."""
    from areal.embedded.corpus import make_problems

    agent = import_from_string(path)(temperature=0.0)
    problems = make_problems("test", 1, seed=5)  # greedy: the model calls the calculator on this one

    async def episodes() -> list[tuple[float, str]]:
        out = []
        for p in problems:
            key = served.open_session(path)
            out.append((await agent.run(p, base_url=served.http + "/v1", api_key=key), key))
        return out

    calls = []
    for reward, key in asyncio.run(episodes()):
        inters = served.interactions(key)
        calls.append(len(inters))
        assert inters and reward in (0.0, 1.0)
        assert all(len(i.output_ids) == len(i.output_logprobs) > 0 for i in inters)
        if len(inters) >= 2:  # after a tool call: the next prompt extends the recorded tokens
            assert (
                inters[1].prompt_ids[: len(inters[0].prompt_ids) + len(inters[0].output_ids)] == inters[0].prompt_ids + inters[0].output_ids
            )
    assert max(calls) >= min_calls  # tool agents: the model called the calculator and was answered
