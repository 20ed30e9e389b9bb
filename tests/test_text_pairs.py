import gzip
import json
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_core.annotation.text_pairs import import_text_pairs, split_hh_dialogue
from rlhf_core.schemas import validate_table

HH_200 = Path(__file__).parent / "data" / "hh-rlhf" / "pairs-200.jsonl.gz"


def dialogue(*turns: str) -> str:
    """'\\n\\nHuman: t0\\n\\nAssistant: t1\\n\\nHuman: t2 ...' from alternating turns."""
    return "".join(f"\n\n{'Human' if i % 2 == 0 else 'Assistant'}: {t}" for i, t in enumerate(turns))


def write_lines(path: Path, lines: list[bytes], gz: bool = False) -> Path:
    data = b"\n".join(lines) + b"\n"
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


def test_split_two_turn_dialogue():
    chosen = dialogue("Hi", "Hello!", "How do I bake bread?", "Mix flour, water, yeast.")
    rejected = dialogue("Hi", "Hello!", "How do I bake bread?", "No idea.")
    prompt, chosen_reply, rejected_reply = split_hh_dialogue(chosen, rejected)
    assert prompt == "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: How do I bake bread?\n\nAssistant:"
    assert chosen_reply == "Mix flour, water, yeast."
    assert rejected_reply == "No idea."


def test_split_rejects_bad_dialogues():
    with pytest.raises(ValueError, match="no '\\\\n\\\\nAssistant:' marker"):
        split_hh_dialogue("\n\nHuman: hi", "\n\nHuman: hi")
    with pytest.raises(ValueError, match="does not start with the chosen prompt"):
        split_hh_dialogue(dialogue("Hi", "A"), dialogue("Hey", "B"))


def test_real_hh_pairs_import_cleanly():
    comparisons, quarantine = import_text_pairs(HH_200, "hh")
    assert (len(comparisons), len(quarantine)) == (200, 0)
    validate_table("comparisons", comparisons)
    assert comparisons["prompt"].str.endswith("Assistant:").all()
    assert comparisons["prompt"].str.startswith("\n\nHuman:").all()
    assert not comparisons["chosen"].str.startswith(" ").any()


def test_every_bad_row_is_quarantined_with_its_reason(tmp_path):
    good = {"chosen": dialogue("Q", "yes"), "rejected": dialogue("Q", "no")}
    rows = [
        json.dumps(good).encode(),
        b"",  # blank: skipped, not a row
        b'{"chosen": "unterminated',
        b'["a", "list"]',
        json.dumps({"chosen": good["chosen"]}).encode(),
        json.dumps({"chosen": good["chosen"], "rejected": 7}).encode(),
        json.dumps({"chosen": good["chosen"], "rejected": "  "}).encode(),
        json.dumps({"chosen": dialogue("Q", "x" * 101), "rejected": dialogue("Q", "no")}).encode(),
        json.dumps({"chosen": dialogue("Q", "yes"), "rejected": dialogue("Other", "no")}).encode(),
        json.dumps({"chosen": good["chosen"], "rejected": good["chosen"]}).encode(),
        json.dumps(good).encode(),
        b'{"chosen": "\xff\xfe"}',
    ]
    comparisons, quarantine = import_text_pairs(write_lines(tmp_path / "bad.jsonl", rows), "hh", max_field_chars=100)
    assert quarantine["reason"].tolist() == [
        "malformed_json", "not_an_object", "missing_field", "not_a_string", "empty_text",
        "oversized_field", "prefix_mismatch", "self_pair", "duplicate", "undecodable",
    ]  # fmt: skip
    assert quarantine["source_index"].tolist() == list(range(2, 12))
    assert quarantine["raw"].iloc[0] == '{"chosen": "unterminated'
    assert len(comparisons) == 1 and comparisons["chosen"].iloc[0] == "yes"
    assert len(comparisons) + len(quarantine) == len(rows) - 1


def test_import_is_idempotent_and_gzip_agnostic(tmp_path):
    first = import_text_pairs(HH_200, "hh")
    second = import_text_pairs(HH_200, "hh")
    plain = tmp_path / "pairs.jsonl"
    plain.write_bytes(gzip.decompress(HH_200.read_bytes()))
    third = import_text_pairs(plain, "hh")
    for other in (second, third):
        pd.testing.assert_frame_equal(first[0], other[0])
        pd.testing.assert_frame_equal(first[1], other[1])


def test_trl_round_trip(tmp_path):
    hh, _ = import_text_pairs(HH_200, "hh")
    records = hh[["prompt", "chosen", "rejected"]].to_dict("records")
    lines = [json.dumps(r, ensure_ascii=False).encode() for r in records]
    trl, quarantine = import_text_pairs(write_lines(tmp_path / "trl.jsonl.gz", lines, gz=True), "trl")
    assert quarantine.empty
    pd.testing.assert_frame_equal(trl, hh)


values = st.one_of(
    st.text(max_size=20),
    st.builds(dialogue, st.text(max_size=10), st.text(max_size=10)),
    st.sampled_from(["", " ", "\ud800", "x" * 60]),
    st.integers(),
    st.none(),
)
objects = st.one_of(
    st.dictionaries(st.sampled_from(["prompt", "chosen", "rejected", "other"]), values, max_size=4),
    st.builds(  # a well-formed HH pair, so that some rows are accepted
        lambda q, a, b: {"chosen": dialogue(q, a), "rejected": dialogue(q, b)},
        st.text(max_size=5), st.sampled_from(["yes", "", "x" * 60]), st.sampled_from(["no", " ", "yes"]),
    ),
)
lines = st.one_of(
    st.text(max_size=30).map(lambda s: s.encode("utf-8")),
    objects.map(lambda o: json.dumps(o).encode()),
    st.binary(max_size=30),
    st.just(b"\x1f\x8b\x08"),  # gzip magic in a plain file is just a bad line
).map(lambda b: b.replace(b"\n", b""))


@settings(max_examples=200, deadline=None)
@given(st.lists(lines, max_size=12), st.integers(0, 4), st.sampled_from(["hh", "trl"]), st.booleans())
def test_import_never_raises_and_keeps_every_row(rows, n_repeated, fmt, gz):
    rows = rows + rows[:n_repeated]  # repeated lines: duplicates
    with tempfile.TemporaryDirectory() as tmp:
        path = write_lines(Path(tmp) / ("rows.jsonl.gz" if gz else "rows.jsonl"), rows, gz=gz)
        comparisons, quarantine = import_text_pairs(path, fmt, max_field_chars=50)
    assert len(comparisons) + len(quarantine) == sum(1 for r in rows if r.strip())
    assert not comparisons["pair_id"].duplicated().any()
