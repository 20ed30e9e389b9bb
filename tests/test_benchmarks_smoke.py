"""Every benchmark runs at minimal size, so none rots (issue 12). TRL is the `bench` extra: without it, skip."""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def _hh_file(path: Path, n: int) -> Path:
    """n HH-RLHF-style pairs: dialogues sharing every turn but the last Assistant reply."""
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for i in range(n):
            prompt = f"\n\nHuman: What is {i} plus {i}?\n\nAssistant:"
            f.write(json.dumps({"chosen": f"{prompt} It is {2 * i}.", "rejected": f"{prompt} No idea."}) + "\n")
    return path


def test_trl_reward_benchmark_writes_its_result_and_doc_section(tmp_path):
    pytest.importorskip("trl")
    import trl_reward

    out_json, doc = tmp_path / "result.json", tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nan earlier section\n")
    argv = ["--pairs-file", str(_hh_file(tmp_path / "pairs.jsonl.gz", 20)), "--pairs", "16", "--repeats", "1",
            "--hidden-size", "32", "--layers", "1", "--max-length", "64", "--json", str(out_json), "--doc", str(doc)]
    trl_reward.main(argv)
    trl_reward.main(argv)  # a second run replaces its section, it does not add one

    result = json.loads(out_json.read_text())
    assert result["setup"]["pairs"] == 16 and result["setup"]["batch_size"] == 16
    assert result["setup"]["same_token_ids"] is True  # both sides train on the same ids
    # one token per byte: the templated prompt of pair 15, its reply "It is 30." (the leading space is the
    # split's) and eos
    assert result["setup"]["longest_pair_tokens"] == len("Q: \n\nHuman: What is 15 plus 15?\n\nAssistant:\nA:") + 9 + 1
    assert set(result["runs"]) == set(trl_reward.CONTENDERS)
    for name, (run,) in result["runs"].items():
        assert run["steps"] == 1 and run["seconds"] > 0 and run["cpu_seconds"] > 0
        assert result["median_pairs_per_cpu_s"][name] == pytest.approx(16 / run["cpu_seconds"])
        assert run["pairs_per_s"] == pytest.approx(16 / run["seconds"])
        assert result["median_pairs_per_s"][name] == statistics.median([run["pairs_per_s"]])
        # 6 FLOPs per non-embedding parameter per real token, over the measured peak
        flops_per_s = 6 * result["setup"]["non_embedding_parameters"] * result["setup"]["real_tokens"] / run["seconds"]
        assert result["mfu"][name] == pytest.approx(flops_per_s / (result["machine"]["fp32_gemm_peak_gflops"] * 1e9))
    median = result["median_pairs_per_s"]
    best_trl = max(median["trl"], median["trl_grouped"])
    assert median[result["trl_best"]] == best_trl
    assert result["ratio_vs_trl"]["project_grouped"] == pytest.approx(median["project_grouped"] / best_trl)
    cpu = result["median_pairs_per_cpu_s"]
    assert result["cpu_ratio_vs_trl"]["project"] == pytest.approx(cpu["project"] / cpu[result["trl_best"]])
    # hidden 32, 1 layer: q 32 x 32 + bias, k and v 32 x 16 + bias (2 of 4 heads), o 32 x 32; MLP 3 x 32 x 96;
    # two layer norms and the final one, 32 each (the tied LM head is the embedding, not counted)
    n_params = (32 * 32 + 32) + 2 * (32 * 16 + 16) + 32 * 32 + 3 * 32 * 96 + 3 * 32
    assert result["setup"]["non_embedding_parameters"] == n_params
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nan earlier section\n")
    assert text.count(trl_reward.SECTION_START) == 1 and text.count("| trl |") == 1
