import gzip
import json
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_core.annotation import text_pairs
from rlhf_core.annotation.text_pairs import (
    check_text_pairs,
    detect_format,
    import_text_pairs,
    import_text_pairs_to,
    split_hh_dialogue,
)
from rlhf_core.schemas import read_table, validate_table

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


def test_a_reply_that_holds_the_marker_stays_a_reply():
    """Cut at the chosen dialogue's last marker, this pair was quarantined as prefix_mismatch."""
    chosen = dialogue("Hi", "Say this: \n\nAssistant: hello")
    rejected = dialogue("Hi", "No.")
    prompt, chosen_reply, rejected_reply = split_hh_dialogue(chosen, rejected)
    assert prompt == "\n\nHuman: Hi\n\nAssistant:" and chosen_reply == "Say this: \n\nAssistant: hello"
    assert rejected_reply == "No."


def test_split_rejects_bad_dialogues():
    with pytest.raises(ValueError, match="no '\\\\n\\\\nAssistant:' marker"):
        split_hh_dialogue("\n\nHuman: hi", "\n\nHuman: hi")
    with pytest.raises(ValueError, match="does not start with the chosen prompt"):
        split_hh_dialogue(dialogue("Hi", "A"), dialogue("Hey", "B"))
    with pytest.raises(ValueError, match="differ before the last reply"):  # split at the first Assistant turn
        split_hh_dialogue(dialogue("Hi", "Hello", "Tell a joke", "Why did the chicken..."), dialogue("Hi", "Go away"))


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


def test_one_text_in_two_unicode_forms_or_with_a_trailing_space_is_no_pair(tmp_path):
    """"x" against "x " and NFC "café" against NFD "café" imported as preference pairs between two texts a reader
    sees as one."""
    rows = [{"prompt": "Q", "chosen": "x", "rejected": "x "},
            {"prompt": "Q", "chosen": "caf\u00e9", "rejected": "cafe\u0301"},
            {"prompt": "Q", "chosen": "x", "rejected": "y"}]
    comparisons, quarantine = import_text_pairs(write_objects(tmp_path / "near.jsonl", rows), "trl")
    assert quarantine["reason"].tolist() == ["self_pair", "self_pair"] and comparisons["rejected"].tolist() == ["y"]


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


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def write_objects(path: Path, objects: list) -> Path:
    return write_lines(path, [json.dumps(o).encode() for o in objects])


def test_trl_messages_match_the_same_dialogues_in_hh_form(tmp_path):
    turns = [("Hi", "Hello!", "How do I bake bread?", "Mix flour, water, yeast.", "No idea."),
             ("Best pet?", "Cats.", "Why?", "They purr.", "Dunno.")]  # fmt: skip
    hh = [{"chosen": dialogue(*t[:4]), "rejected": dialogue(*t[:3], t[4])} for t in turns]
    conversational = [
        {"prompt": [user(q1), assistant(a1), user(q2)], "chosen": [assistant(good)], "rejected": [assistant(bad)]}
        for q1, a1, q2, good, bad in turns
    ]
    from_hh, _ = import_text_pairs(write_objects(tmp_path / "hh.jsonl", hh), "hh")
    from_messages, quarantine = import_text_pairs(write_objects(tmp_path / "msg.jsonl", conversational), "trl_messages")
    assert quarantine.empty
    pd.testing.assert_frame_equal(from_messages, from_hh)
    prompt = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: How do I bake bread?\n\nAssistant:"
    assert from_messages["prompt"].iloc[0] == prompt
    assert from_messages["chosen"].iloc[0] == "Mix flour, water, yeast."


def test_trl_messages_other_roles_and_several_replies(tmp_path):
    row = {
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "tool", "content": "42"}, user("Answer?")],
        "chosen": [assistant("It is"), assistant("42.")],
        "rejected": [assistant("No.")],
    }
    comparisons, _ = import_text_pairs(write_objects(tmp_path / "msg.jsonl", [row]), "trl_messages")
    assert comparisons["prompt"].iloc[0] == "\n\nSystem: Be brief.\n\nTool: 42\n\nHuman: Answer?\n\nAssistant:"
    assert comparisons["chosen"].iloc[0] == "It is\n\n42."


def test_every_bad_message_list_is_quarantined(tmp_path):
    good = {"prompt": [user("Q")], "chosen": [assistant("yes")], "rejected": [assistant("no")]}
    rows = [
        good,
        {**good, "prompt": "Q"},  # not a list
        {**good, "chosen": []},  # empty list
        {**good, "prompt": [user("Q"), "A"]},  # item not an object
        {**good, "rejected": [{"content": "no"}]},  # no role
        {**good, "chosen": [{"role": "assistant"}]},  # no content
        {**good, "chosen": [{"role": "assistant", "content": 7}]},  # content not a string
        {**good, "chosen": [assistant(" ")]},
        {"prompt": [user("Q")], "chosen": [assistant("yes")]},
    ]
    comparisons, quarantine = import_text_pairs(write_objects(tmp_path / "msg.jsonl", rows), "trl_messages")
    assert len(comparisons) == 1
    assert quarantine["reason"].tolist() == ["bad_messages"] * 6 + ["empty_text", "missing_field"]
    assert quarantine["detail"].iloc[2] == "prompt[1] is a JSON str, not an object"
    assert quarantine["detail"].iloc[3] == "rejected[0] has no string 'role'"


def test_margin_labels_map_to_llama2_margins(tmp_path):
    labels = ["significantly better", "better", "slightly better", "negligibly better", "unsure"]
    labels += [None, "much better", 3]  # no label (NaN), then two bad ones
    rows = [{"prompt": f"q{i}", "chosen": "a", "rejected": "b", "margin_label": x} for i, x in enumerate(labels)]
    rows.append({"prompt": "no label", "chosen": "a", "rejected": "b"})
    comparisons, quarantine = import_text_pairs(write_objects(tmp_path / "trl.jsonl", rows), "trl")
    assert comparisons["margin"].dtype == float
    assert comparisons["margin"].tolist()[:5] == [3.0, 2.0, 1.0, 0.0, 0.0]
    assert comparisons["margin"].iloc[5:].isna().all() and len(comparisons) == 7
    assert quarantine["reason"].tolist() == ["bad_margin_label", "bad_margin_label"]
    assert quarantine["source_index"].tolist() == [6, 7]
    hh = {"chosen": dialogue("Q", "yes"), "rejected": dialogue("Q", "no"), "margin_label": "better"}
    assert import_text_pairs(write_objects(tmp_path / "hh.jsonl", [hh]), "hh")[0]["margin"].tolist() == [2.0]


def test_detect_format_on_each_kind(tmp_path):
    noise = [b"", b"not json", b"[1, 2]", b'{"id": 1}']  # skipped or undecided before the telling line
    messages = {"prompt": [user("Q")], "chosen": [assistant("a")], "rejected": [assistant("b")]}
    cases = {
        "trl_messages": messages,
        "trl": {"prompt": "Q", "chosen": "a", "rejected": "b"},
        "hh": {"chosen": dialogue("Q", "a"), "rejected": dialogue("Q", "b")},
    }
    for fmt, row in cases.items():
        path = write_lines(tmp_path / f"{fmt}.jsonl.gz", [*noise, json.dumps(row).encode()], gz=True)
        assert detect_format(path) == fmt
        comparisons, quarantine = import_text_pairs(path)  # fmt="auto" by default
        assert len(comparisons) == 1 and comparisons["chosen"].iloc[0] == "a"
        assert len(quarantine) == 3


def test_detect_format_explains_what_it_saw(tmp_path):
    rows = [{"question": "Q", "answer": "a"}] * 20 + [{"prompt": "Q", "chosen": "a", "rejected": "b"}]
    path = write_objects(tmp_path / "odd.jsonl", rows)
    with pytest.raises(ValueError, match=r"from 20 JSON object line\(s\).*'answer', 'question'.*fmt='trl_messages'"):
        detect_format(path)
    with pytest.raises(ValueError, match="pass fmt="):
        import_text_pairs(write_lines(tmp_path / "empty.jsonl", [b""]), "auto")
    # TRL's implicit-prompt conversational rows were taken for HH dialogues, then every row refused as not_a_string
    implicit = write_objects(tmp_path / "implicit.jsonl", [{"chosen": [user("Q"), assistant("a")],
                                                            "rejected": [user("Q"), assistant("b")]}])
    with pytest.raises(ValueError, match="without a prompt .TRL's implicit prompt. are not read: give each row its "
                                         "prompt messages"):
        detect_format(implicit)


messages = st.lists(
    st.one_of(st.builds(user, st.text(max_size=5)), st.builds(assistant, st.sampled_from(["", "a"])), st.integers()),
    max_size=3,
)
values = st.one_of(
    messages,

    st.text(max_size=20),
    st.builds(dialogue, st.text(max_size=10), st.text(max_size=10)),
    st.sampled_from(["", " ", "\ud800", "x" * 60, "better", "unsure"]),
    st.integers(),
    st.none(),
)
objects = st.one_of(
    st.dictionaries(st.sampled_from(["prompt", "chosen", "rejected", "margin_label", "other"]), values, max_size=5),
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
@given(st.lists(lines, max_size=12), st.integers(0, 4), st.sampled_from(["hh", "trl", "trl_messages"]), st.booleans())
def test_import_never_raises_and_keeps_every_row(rows, n_repeated, fmt, gz):
    rows = rows + rows[:n_repeated]  # repeated lines: duplicates
    with tempfile.TemporaryDirectory() as tmp:
        path = write_lines(Path(tmp) / ("rows.jsonl.gz" if gz else "rows.jsonl"), rows, gz=gz)
        comparisons, quarantine = import_text_pairs(path, fmt, max_field_chars=50)
    assert len(comparisons) + len(quarantine) == sum(1 for r in rows if r.strip())
    assert not comparisons["pair_id"].duplicated().any()


def hh_file_with_bad_rows(path: Path) -> Path:
    """The 200 real HH pairs with a malformed line after every 20th and a repeat of every 30th."""
    lines = gzip.decompress(HH_200.read_bytes()).splitlines()
    mixed = []
    for i, line in enumerate(lines):
        mixed.append(line)
        if i % 20 == 0:
            mixed += [b'{"chosen": "cut off', b""]
        if i % 30 == 0:
            mixed.append(line)
    return write_lines(path, mixed)


def assert_streamed_equals_in_memory(path: Path, out_dir: Path, fmt: str, batch_rows: int, **kwargs) -> None:
    comparisons, quarantine = import_text_pairs(path, fmt, **kwargs)
    summary = import_text_pairs_to(path, out_dir, fmt, batch_rows=batch_rows, **kwargs)
    streamed = read_table("comparisons", summary.comparisons_path)
    streamed_quarantine = pd.read_parquet(summary.quarantine_path)
    # an empty in-memory frame has object columns, an empty Parquet column its declared type
    pd.testing.assert_frame_equal(streamed, comparisons, check_dtype=not comparisons.empty)
    pd.testing.assert_frame_equal(streamed_quarantine, quarantine, check_dtype=not quarantine.empty)
    assert (summary.accepted, summary.quarantined) == (len(comparisons), len(quarantine))
    assert summary.accepted + summary.quarantined == summary.rows
    assert summary.reasons == quarantine["reason"].value_counts(sort=False).to_dict()


def test_streamed_import_equals_in_memory_import(tmp_path):
    assert_streamed_equals_in_memory(HH_200, tmp_path / "hh", "hh", batch_rows=7)
    mixed = hh_file_with_bad_rows(tmp_path / "mixed.jsonl")
    assert_streamed_equals_in_memory(mixed, tmp_path / "mixed", "auto", batch_rows=7)
    summary = import_text_pairs_to(mixed, tmp_path / "mixed", batch_rows=7)
    assert (summary.fmt, summary.rows, summary.accepted) == ("hh", 217, 200)
    assert pq.ParquetFile(summary.comparisons_path).num_row_groups == 29  # ceil(200 / 7) batches
    assert summary.reasons == {"malformed_json": 10, "duplicate": 7}
    assert sorted(p.name for p in (tmp_path / "mixed").iterdir()) == ["comparisons.parquet", "quarantine.parquet"]


def test_duplicates_are_found_among_merged_pair_digests(tmp_path, monkeypatch):
    monkeypatch.setattr(text_pairs, "DIGEST_MERGE_EVERY", 16)  # most earlier pairs end up in the sorted array
    lines = gzip.decompress(HH_200.read_bytes()).splitlines()
    path = write_lines(tmp_path / "twice.jsonl", lines + lines[::-1])
    comparisons, quarantine = import_text_pairs(path, "hh")
    assert len(comparisons) == 200 and quarantine["reason"].eq("duplicate").all() and len(quarantine) == 200
    assert quarantine["source_index"].tolist() == list(range(200, 400))
    summary = import_text_pairs_to(path, tmp_path / "out", "hh", batch_rows=7)
    assert (summary.accepted, summary.reasons) == (200, {"duplicate": 200})


def test_failed_streamed_import_leaves_earlier_files_untouched(tmp_path, monkeypatch):
    fresh, earlier = tmp_path / "fresh", tmp_path / "earlier"
    one_pair = write_objects(tmp_path / "one.jsonl", [{"prompt": "Q", "chosen": "a", "rejected": "b"}])
    import_text_pairs_to(one_pair, earlier)
    before = {p.name: p.read_bytes() for p in earlier.iterdir()}
    calls = 0

    def parse_then_fail(*args):
        nonlocal calls
        calls += 1
        if calls > 50:  # after several batches of 7 reached the temporary files
            raise RuntimeError("disk on fire")
        return parse(*args)

    parse = text_pairs._parse
    monkeypatch.setattr(text_pairs, "_parse", parse_then_fail)
    for out_dir in (fresh, earlier):
        calls = 0
        with pytest.raises(RuntimeError, match="disk on fire"):
            import_text_pairs_to(HH_200, out_dir, "hh", batch_rows=7)
    assert list(fresh.iterdir()) == []
    assert {p.name: p.read_bytes() for p in earlier.iterdir()} == before


@settings(max_examples=40, deadline=None)
@given(st.lists(lines, max_size=12), st.integers(0, 4), st.sampled_from(list(text_pairs.FIELDS)), st.integers(1, 4))
def test_streamed_import_equals_in_memory_on_any_lines(rows, n_repeated, fmt, batch_rows):
    rows = rows + rows[:n_repeated]
    with tempfile.TemporaryDirectory() as tmp:
        path = write_lines(Path(tmp) / "rows.jsonl", rows)
        assert_streamed_equals_in_memory(path, Path(tmp) / "out", fmt, batch_rows, max_field_chars=50)


def test_a_byte_order_mark_before_the_first_row_is_not_an_error(tmp_path):
    """Windows tools start UTF-8 files with a byte-order mark: a one-row export was refused as "UTF-16 or binary?",
    a longer one lost its first row to malformed_json."""
    rows = [json.dumps({"chosen": dialogue("Q", "yes"), "rejected": dialogue("Q", "no")}).encode(),
            json.dumps({"chosen": dialogue("R", "yes"), "rejected": dialogue("R", "no")}).encode()]
    one = write_lines(tmp_path / "one.jsonl", [b"\xef\xbb\xbf" + rows[0]])
    check_text_pairs(one)
    two = write_lines(tmp_path / "two.jsonl", [b"\xef\xbb\xbf" + rows[0], rows[1]])
    comparisons, quarantine = import_text_pairs(two, "hh")
    assert len(comparisons) == 2 and quarantine.empty
