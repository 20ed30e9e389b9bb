"""The models of a generation plan: resolved to local directories, named by content, checked before any work.

A `GeneratorSpec` names a model ("policy" = the round's policy artifact, else a local directory).
`resolve_generators` turns each into a `Generator` whose `generator_id` goes into every row:

    <spec name>:<digest[:12]>

where the digest is the policy artifact's digest for "policy", and for a directory the sha256 of
the names and bytes of its model files (config.json, generation_config.json, weights, tokenizer
files; see MODEL_FILE_PATTERNS). It is the same wherever the directory is copied and changes
whenever the weights or tokenizer change, so a cached stage is never served for other weights.
Hashing reads the weights once (about a second per GB).

Everything is read with local_files_only=True: nothing is ever downloaded.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from rlhf_core.config import GeneratorSpec, SamplingStrategy
from rlhf_core.generation.plan import (
    GenerationInputError,
    check_prompts,
    context_length,
)
from rlhf_core.models import default_device

POLICY = "policy"  # GeneratorSpec.model value meaning "this round's policy artifact"
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
MODEL_FILE_PATTERNS = ("config.json", "generation_config.json", *WEIGHT_PATTERNS, "tokenizer*", "vocab*",
                       "merges.txt", "special_tokens_map.json", "added_tokens.json", "chat_template*", "*.model")


@dataclass(frozen=True)
class Generator:
    """A generator ready to run: where its model is and what its rows are called."""

    name: str  # the spec's name: metric names, shard folder
    generator_id: str  # written into every row's generator column and response_id
    path: str  # a local Hugging Face directory
    strategies: tuple[SamplingStrategy, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "generator_id": self.generator_id, "path": self.path,
                "strategies": [s.model_dump() for s in self.strategies]}

    @classmethod
    def from_json(cls, data: dict) -> Generator:
        strategies = tuple(SamplingStrategy.model_validate(s) for s in data["strategies"])
        return cls(data["name"], data["generator_id"], data["path"], strategies)


def save_generators(generators: list[Generator], path: Path) -> None:
    Path(path).write_text(json.dumps([g.to_json() for g in generators], indent=1))


def read_generators(path: Path) -> list[Generator]:
    return [Generator.from_json(g) for g in json.loads(Path(path).read_text())]


def generators_identity(path: Path) -> str:
    """What the generators of `path` compute: names, ids (a model's id holds its content digest) and strategies, not
    where the models lie (the policy's path moves with a moved workdir; a killed run there resumes its shards)."""
    computed = [{k: v for k, v in g.to_json().items() if k != "path"} for g in read_generators(path)]
    return "generators:" + hashlib.sha256(json.dumps(computed, sort_keys=True).encode()).hexdigest()


def model_files(path: Path) -> list[Path]:
    """The top-level files of a model directory that decide its outputs, sorted by name."""
    return sorted(f for f in path.iterdir()
                  if f.is_file() and any(fnmatch.fnmatch(f.name, p) for p in MODEL_FILE_PATTERNS))


def model_dir_digest(path: Path) -> str:
    """sha256 over the names and bytes of `model_files(path)`."""
    h = hashlib.sha256()
    for f in model_files(path):
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as stream:
            while chunk := stream.read(1 << 24):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def resolve_generators(specs: tuple[GeneratorSpec, ...], policy_path: str, policy_digest: str) -> list[Generator]:
    """Check every generator's model and name it; raise GenerationInputError before any generation."""
    resolved = []
    for i, spec in enumerate(specs):
        field = f"generation.generators[{i}].model"
        if spec.model == POLICY:
            path, digest = Path(policy_path), policy_digest
        else:
            path = Path(spec.model).expanduser().resolve()
            _check_model_dir(path, field)
            digest = model_dir_digest(path)
        check_loadable(path, field)
        resolved.append(Generator(spec.name, f"{spec.name}:{digest[:12]}", str(path), spec.strategies))
    return resolved


def _check_model_dir(path: Path, field: str) -> None:
    todo = (f'give a local directory written by save_pretrained (a causal LM and its tokenizer), or "{POLICY}" '
            "for this round's policy")
    if not path.is_dir():
        raise GenerationInputError(f"{field}: {path} is not a directory; {todo}")
    if not (path / "config.json").is_file():
        raise GenerationInputError(f"{field}: {path} has no config.json, so it is not a model directory; {todo}")
    if not any(fnmatch.fnmatch(f.name, p) for f in path.iterdir() for p in WEIGHT_PATTERNS):
        raise GenerationInputError(f"{field}: {path} has no weights (*.safetensors or pytorch_model*.bin); {todo}")


def check_loadable(path: Path, field: str) -> None:
    """Config and tokenizer load offline, the architecture is a causal LM, the tokenizer has an eos."""
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        tokenizer = load_tokenizer(path)
    except Exception as err:  # transformers raises many kinds: OSError, ValueError, KeyError, ...
        raise GenerationInputError(
            f"{field}: {path} does not load with transformers ({type(err).__name__}: {err}); check that it was "
            "written by save_pretrained with its tokenizer and that this transformers version knows the architecture"
        ) from err
    # the saved architecture too: BERT's type has a causal-LM class, but a sentence encoder's weights are no LM
    heads = config.architectures or []
    causal = {*MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()}  # Gemma 3's is ...ForConditionalGeneration
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or (
            heads and not any(a in causal or a.endswith(("ForCausalLM", "LMHeadModel")) for a in heads)):
        raise GenerationInputError(
            f"{field}: {path} is a {config.model_type!r} model ({', '.join(heads) or 'no architecture saved'}), not "
            "a causal LM; give a model that AutoModelForCausalLM loads"
        )
    if tokenizer.eos_token_id is None:
        raise GenerationInputError(f"{field}: the tokenizer in {path} has no eos token; set eos_token and re-save it")


def check_prompts_fit(generators: list[Generator], prompts: pd.DataFrame) -> None:
    """Every prompt leaves room for the longest response of every generator, in that model's context."""
    for g in generators:
        config = AutoConfig.from_pretrained(g.path, local_files_only=True)
        longest = max(s.max_new_tokens for s in g.strategies)
        check_prompts(prompts, load_tokenizer(g.path), context_length(config), longest, model=f"generator {g.name}")


def load_tokenizer(path: str | Path):
    """The model's own tokenizer, offline; pad falls back to eos (left padding needs a pad id)."""
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(path: str | Path, device: str | torch.device | None = None) -> torch.nn.Module:
    """The causal LM in eval mode on `device` (default: `default_device`): float32 on CPU, the checkpoint's
    own dtype on a GPU."""
    device = torch.device(device or default_device())
    dtype = torch.float32 if device.type == "cpu" else "auto"
    model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=dtype)
    return model.to(device).eval()
