"""Paths named in configs must resolve under allowed roots.

A config is data a person (or a Prefect UI form) typed; a path in it must not reach files the
pipeline has no business reading (`../../etc/passwd`, a symlink out of the project). Every such
path is resolved (symlinks followed, `..` removed) and must then lie under one of:

- the current working directory (the project a person or a Prefect worker runs from),
- each directory listed in the environment variable RLHF_ALLOWED_ROOTS (os.pathsep-separated),
  for data kept elsewhere, e.g. `RLHF_ALLOWED_ROOTS=/data/annotations:/models`,
- the round's workdir (artifacts, caches), when it lies under one of those: the workdir is itself a value of the
  config, so a form that set `workdir: /` would otherwise have allowed every file on the machine.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOTS_ENV = "RLHF_ALLOWED_ROOTS"


class PathNotAllowedError(ValueError):
    """A config path outside every allowed root, or missing; the message says how to fix it."""


def allowed_roots(workdir: str | Path | None = None, trust_workdir: bool = False) -> list[Path]:
    """The current directory, RLHF_ALLOWED_ROOTS, and `workdir` when it lies under one of these, or always with
    `trust_workdir` (an artifact directory a stage is given: only a directory with a manifest is read)."""
    roots = [Path.cwd()] + [Path(p) for p in os.environ.get(ROOTS_ENV, "").split(os.pathsep) if p.strip()]
    roots = [r.expanduser().resolve() for r in roots]
    if workdir is not None:
        resolved = Path(workdir).expanduser().resolve()
        if trust_workdir or any(resolved.is_relative_to(root) for root in roots):
            roots.append(resolved)
    return roots


def resolve_allowed(path: str | Path, field: str, roots: list[Path], must_exist: bool = True) -> Path:
    """The resolved `path`, checked to lie under one of `roots` (and to exist, by default).

    `field` is the config key that named the path (e.g. "annotation.exports[0]"), for the message.
    """
    if "://" in str(path):  # not shown: a URL may carry a token
        raise PathNotAllowedError(f"{field}: a URL (not shown), not a local path: every model and file loads from a "
                                  "local path; download it first and give that path")
    resolved = Path(path).expanduser().resolve()
    if not any(resolved.is_relative_to(root) for root in roots):
        shown = ", ".join(str(r) for r in roots)
        raise PathNotAllowedError(
            f"{field}: {path} resolves to {resolved}, outside the allowed roots ({shown}); move the file "
            f"under one of them or add its folder to {ROOTS_ENV} (separated by {os.pathsep!r})"
        )
    if must_exist and not resolved.exists():
        raise PathNotAllowedError(f"{field}: {path} does not exist (resolved to {resolved})")
    return resolved


def config_paths(config) -> list[tuple[str, str]]:
    """(config key, path) of every file or directory a RoundConfig reads."""
    out = [(f"annotation.exports[{i}]", p) for i, p in enumerate(config.annotation.exports)]
    out += [(f"generation.generators[{i}].model", g.model)
            for i, g in enumerate(config.generation.generators) if g.model != "policy"]
    tagger = config.sampling.tagger
    out += [(f"sampling.tagger.{name}", getattr(tagger, name)) for name in ("model_path", "vocabulary_file")
            if getattr(tagger, name)]
    if config.policy_model.pretrained:
        out.append(("policy_model.pretrained", config.policy_model.pretrained))
    out += [(f"{stage}.deepspeed", getattr(config, stage).deepspeed) for stage in ("reward", "ppo")
            if getattr(config, stage).deepspeed not in (None, "zero2", "zero3")]  # else a DeepSpeed JSON file
    evaluation = config.evaluation
    out += [(key, path) for key, path in (("evaluation.local.model_path", evaluation.local.model_path),
                                          ("evaluation.prompt_source", evaluation.prompt_source)) if path]
    return out


def check_config_paths(config) -> dict[str, Path]:
    """Resolve every path of a RoundConfig under the allowed roots (see the module docstring);
    raise PathNotAllowedError naming the first key that is outside them, missing, or of the wrong
    kind (an export that is a directory, a workdir that is a file)."""
    workdir = Path(config.workdir).expanduser()
    if workdir.exists() and not workdir.is_dir():
        raise PathNotAllowedError(f"workdir: {config.workdir} is a file; give a directory (it is created if missing)")
    roots = allowed_roots(config.workdir)
    resolved = {key: resolve_allowed(path, key, roots) for key, path in config_paths(config)}
    for key, path in resolved.items():
        if key.startswith("annotation.exports") and not path.is_file():
            raise PathNotAllowedError(f"{key}: {path} is a directory; list the export files themselves")
        if key.endswith(".deepspeed"):
            check_deepspeed_json(key, path)
        if key == "sampling.tagger.vocabulary_file" and config.sampling.tagger.source == "embedding":
            check_vocabulary_file(key, path)
        if key in MODEL_DIR_KEYS or key.startswith("generation.generators["):  # else found only stages later
            if not (path / "config.json").is_file():
                raise PathNotAllowedError(f"{key}: {path} is not a Hugging Face model directory (no config.json): "
                                          "give a directory written by save_pretrained (or `rlhf convert-gguf`)")
            from rlhf_core.generation.generators import check_loadable  # transformers: only when a model is named

            check_loadable(path, key)  # a causal LM with an eos (a sentence encoder failed SFT with a traceback)
    return resolved


MODEL_DIR_KEYS = {"policy_model.pretrained", "evaluation.local.model_path"}


def check_vocabulary_file(key: str, path: Path) -> None:
    """The embedding tagger's tags, read as the sample stage reads them (else a repeated tag or a file of comments
    failed there, after the world and SFT stages, with a traceback)."""
    from rlhf_core.sampling.embedding import load_vocabulary, vocabulary_tags

    try:
        vocabulary_tags(load_vocabulary(path))
    except (ValueError, OSError) as err:  # UnicodeDecodeError is a ValueError
        raise PathNotAllowedError(f"{key}: {err}") from None


def check_deepspeed_json(key: str, path: Path) -> None:
    """A stage's own DeepSpeed JSON: readable JSON with no optimizer or scheduler section (the stages bring
    their own AdamW and learning-rate schedule), checked before any work rather than in the worker."""
    import json

    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PathNotAllowedError(f"{key}: {path} is not a readable DeepSpeed JSON config ({err})") from None
    if not isinstance(config, dict):
        raise PathNotAllowedError(f"{key}: {path} holds a JSON {type(config).__name__}, not a DeepSpeed config")
    if sections := [name for name in ("optimizer", "scheduler") if name in config]:
        raise PathNotAllowedError(f"{key}: {path} names {' and '.join(sections)}; the stage brings its own AdamW and "
                                  "learning-rate schedule (its lr and schedule settings): remove those sections")
