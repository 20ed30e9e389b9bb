"""The artifact store: whole-content digests, atomic commits, cache lookups and lineage."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from rlhf_core.artifacts import ArtifactRef, ArtifactStore, atomic_write_text, cache_key, content_digest
from rlhf_core.schemas import read_table, write_table


def _commit(store, staged, kind="prompts", inputs=None, key="k"):
    return store.commit(staged, kind=kind, stage="s", stage_version="1", code_version="t", config={"a": 1},
                        config_digest="c", inputs=inputs or {}, cache_key=key)


def test_digest_covers_every_byte_and_path(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    (a / "x.bin").write_bytes(b"\0" * 100_000 + b"1")
    d1, _ = content_digest(a)
    (a / "x.bin").write_bytes(b"\0" * 100_000 + b"2")  # change the last byte only
    d2, _ = content_digest(a)
    (a / "x.bin").rename(a / "y.bin")
    d3, _ = content_digest(a)
    assert len({d1, d2, d3}) == 3
    assert content_digest(a)[0] == d3  # stable


def test_committed_files_and_atomic_writes_have_a_plain_files_mode(tmp_path):
    """A temp file is 0600 (mkstemp: safetensors' weights and our atomic writes): a team's other accounts could not
    read a committed model. Committed and atomically written files get what open() gives under the umask."""
    import tempfile

    from rlhf_core.artifacts import umask

    plain = 0o666 & ~umask()
    store = ArtifactStore(tmp_path / "store")
    with store.staging() as staged:
        fd, weights = tempfile.mkstemp(dir=staged)  # as safetensors writes model.safetensors
        os.write(fd, b"w")
        os.close(fd)
        (staged / "sub").mkdir()
        atomic_write_text(staged / "sub" / "table.json", "{}")
        ref = _commit(store, staged)
    modes = {p.relative_to(ref.path).as_posix(): p.stat().st_mode & 0o777 for p in Path(ref.path).rglob("*")
             if p.is_file()}
    assert modes == {Path(weights).name: plain, "sub/table.json": plain, "provenance.json": plain,
                     "manifest.json": plain}
    assert plain != 0o600 and store.verify(ref)
    # the artifact's directory was the staging's mkdtemp (0700): nobody else could list or enter it
    assert {d: Path(d).stat().st_mode & 0o777 for d in (ref.path, f"{ref.path}/sub")} == dict.fromkeys(
        (ref.path, f"{ref.path}/sub"), 0o777 & ~umask())


def test_commit_lookup_verify_lineage(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    with store.staging() as staged:
        write_table("prompts", pd.DataFrame({"prompt_id": ["p1"], "prompt": ["hi"], "tags": [["a"]],
                                              "source": ["t"]}), staged / "prompts.parquet")
        up = _commit(store, staged, key="k1")
    assert store.lookup("k1") == up and store.verify(up)
    assert read_table("prompts", up.file("prompts.parquet"))["tags"].tolist() == [["a"]]
    with store.staging() as staged:
        (staged / "out.txt").write_text("derived")
        down = _commit(store, staged, kind="derived", inputs={"prompts": up}, key="k2")
    lineage = store.lineage(down)
    assert [m.kind for m in lineage] == ["derived", "prompts"]
    assert lineage[0].inputs[0].digest == up.digest
    assert store.lookup("missing") is None
    # identical content commits to the same artifact
    with store.staging() as staged:
        (staged / "out.txt").write_text("derived")
        again = _commit(store, staged, kind="derived", inputs={"prompts": up}, key="k3")
    assert again.path == down.path
    with store.staging() as staged:
        (staged / "out.txt").write_text("derived, another")
        other = _commit(store, staged, kind="derived", inputs={"prompts": up}, key="k4")
    assert store.artifacts("derived") == sorted([down, other], key=lambda r: r.digest)  # each once, digest order
    assert store.artifacts("prompts") == [up] and store.artifacts("votes") == []
    (tmp_path / "store" / "derived" / down.digest / "out.txt").write_text("tampered")
    assert not store.verify(down)


def test_the_same_tables_from_two_executions_are_two_artifacts_each_with_its_own_manifest(tmp_path):
    """An evaluation judged against another reward model writes the same judgements table with other metrics: one
    artifact would keep the first execution's manifest (its metrics, its inputs) for both."""
    store = ArtifactStore(tmp_path / "store")
    made = {}
    for reward_model, score in (("rm-a", -27.1), ("rm-b", -28.9)):
        with store.staging() as staged:
            (staged / "judgements.parquet").write_bytes(b"the same verdicts")
            made[reward_model] = store.commit(
                staged, kind="judgements", stage="evaluate", stage_version="1", code_version="t", config={},
                config_digest="c", cache_key=f"key-{reward_model}", metrics={"eval/policy/reward": score},
                inputs={"reward_model": ArtifactRef(kind="reward_model", digest=reward_model, path="/x")})
    a, b = made["rm-a"], made["rm-b"]
    assert a.digest != b.digest and store.lookup("key-rm-b") == b
    assert store.manifest(b).metrics == {"eval/policy/reward": -28.9}
    assert [i.digest for i in store.manifest(b).inputs] == ["rm-b"] and store.verify(a) and store.verify(b)
    assert json.loads((Path(b.path) / "provenance.json").read_text()) == {
        "stage": "evaluate", "stage_version": "1", "config_digest": "c", "inputs": {"reward_model": "rm-b"}}


def test_damage_names_what_changed_a_broken_artifact_is_a_miss_and_its_recommit_heals_it(tmp_path):
    store = ArtifactStore(tmp_path / "store")

    def make(key):
        with store.staging() as staged:
            (staged / "weights.bin").write_bytes(b"w" * 1000)
            (staged / "config.json").write_text("{}")
            return _commit(store, staged, kind="policy", key=key)

    ref = make("k1")
    assert store.damage(ref) == [] and store.lookup("k1") == ref
    root = tmp_path / "store" / "policy" / ref.digest
    (root / "weights.bin").write_bytes(b"w" * 999 + b"x")  # one byte: only a full check sees it
    assert store.damage(ref, hash_files=False) == [] and store.lookup("k1") == ref
    [changed] = store.damage(ref)
    assert changed.startswith("weights.bin: changed (sha256 ") and not store.verify(ref)
    (root / "config.json").unlink()
    (root / "stray.txt").write_text("?")
    assert store.damage(ref, hash_files=False) == ["config.json: missing", "stray.txt: not in the manifest"]
    assert store.lookup("k1") is None  # the stage runs again ...
    assert make("k1") == ref  # ... and its commit replaces the damaged copy of the same content
    assert store.damage(ref) == [] and store.lookup("k1") == ref
    (root / "weights.bin").write_bytes(b"broken")
    assert store.remove(ref) == ["k1"]  # the damaged artifact and its cache entry: the next run makes it again
    assert not root.exists() and store.lookup("k1") is None and not list((tmp_path / "store" / ".staging").iterdir())
    (root.parent / ("f" * 64)).mkdir()
    (root.parent / ("f" * 64) / "manifest.json").write_text("{not json")
    assert store.damage(store.find("policy", "f" * 64)) == ["manifest.json unreadable (ValidationError)"]


def test_cache_key_depends_on_every_part():
    base = cache_key("s", "1", "c", {"x": "d"})
    assert base == cache_key("s", "1", "c", {"x": "d"})
    assert len({base, cache_key("s", "2", "c", {"x": "d"}), cache_key("s", "1", "c2", {"x": "d"}),
                cache_key("s", "1", "c", {"x": "e"}), cache_key("t", "1", "c", {"x": "d"})}) == 5


def test_killed_stage_leaves_no_artifact(tmp_path):
    """A process killed while writing into staging leaves nothing under the kind's directory."""
    root = tmp_path / "store"
    script = textwrap.dedent(f"""
        import os, time
        from rlhf_core.artifacts import ArtifactStore
        store = ArtifactStore({str(root)!r})
        with store.staging() as staged:
            (staged / "big.bin").write_bytes(b"x" * 1000)
            print("writing", flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (root / "prompts").exists() and not (root / "cache").exists()
    store = ArtifactStore(root)
    assert store.lookup("anything") is None


@pytest.mark.parametrize("killed", ["before the rename", "after the rename, before the cache entry"])
def test_a_stage_killed_inside_commit_leaves_nothing_a_lookup_serves_and_its_rerun_commits_the_same(tmp_path, killed):
    """The kill lands in commit itself (the test above only kills while a stage writes into staging): either nothing
    is in place, or the whole artifact is, without a cache entry; the re-run commits the same digest and indexes it."""
    root = tmp_path / "store"
    script = textwrap.dedent(f"""
        import os, signal
        from rlhf_core import artifacts
        real_rename = os.rename
        def rename_then_die(src, dst):
            if {killed == "after the rename, before the cache entry"}:
                real_rename(src, dst)
            os.kill(os.getpid(), signal.SIGKILL)
        artifacts.os.rename = rename_then_die
        store = artifacts.ArtifactStore({str(root)!r})
        with store.staging() as staged:
            (staged / "table.bin").write_bytes(b"x" * 1000)
            store.commit(staged, kind="prompts", stage="s", stage_version="1", code_version="t", config={{"a": 1}},
                         config_digest="c", inputs={{}}, cache_key="k")
    """)
    assert subprocess.run([sys.executable, "-c", script]).returncode == -signal.SIGKILL
    store = ArtifactStore(root)
    assert store.lookup("k") is None  # nothing is served from the cache
    placed = store.committed()
    assert len(placed) == (1 if killed.startswith("after") else 0)
    assert all(store.damage(ref) == [] for ref in placed)  # what is in place is whole
    assert store.sweep_staging() == (0 if killed.startswith("after") else 1)
    with store.staging() as staged:
        (staged / "table.bin").write_bytes(b"x" * 1000)
        ref = _commit(store, staged)
    assert store.lookup("k") == ref and [r.digest for r in store.committed()] == [ref.digest]


def test_atomic_write_text_replaces_whole_file(tmp_path):
    path = tmp_path / "f.json"
    atomic_write_text(path, "old")
    atomic_write_text(path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_empty_artifact_refused(tmp_path):
    store = ArtifactStore(tmp_path)
    with store.staging() as staged, pytest.raises(ValueError, match="empty"):
        _commit(store, staged)


def test_every_file_of_an_artifact_is_on_disk_before_its_cache_entry(tmp_path, monkeypatch):
    """A power loss after the commit must not leave a cache entry pointing at files the kernel never wrote."""
    import rlhf_core.artifacts as artifacts

    events = []
    real_fsync = os.fsync

    def fsync(fd):
        events.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(artifacts.os, "fsync", fsync)
    staged = tmp_path / "staged"
    (staged / "sub").mkdir(parents=True)
    (staged / "table.parquet").write_bytes(b"rows")
    (staged / "sub" / "weights.bin").write_bytes(b"w")
    ref = _commit(ArtifactStore(tmp_path / "store"), staged, key="k-fsync")
    entry = next(i for i, name in enumerate(events) if name.startswith(".k-fsync.json."))  # the cache entry's temp
    assert {"table.parquet", "weights.bin", "manifest.json", "sub"} <= set(events[:entry])
    assert events.index("prompts") < entry  # the kind's directory, after the artifact was renamed into it
    assert ref.kind == "prompts"


def test_a_metric_with_nothing_to_measure_is_left_out_and_a_manifest_holding_one_reads_back(tmp_path):
    """NaN (flip precision when denoising flipped nothing) and inf are not in the manifest: JSON has no NaN, and a
    null there once made a committed artifact unreadable, its cache entry served to every later run. A manifest
    written that way reads back too, without the metric."""
    import json

    from rlhf_core.artifacts import MANIFEST

    store = ArtifactStore(tmp_path / "store")
    with store.staging() as staged:
        (staged / "denoised.txt").write_text("pairs")
        ref = store.commit(staged, kind="denoised", stage="denoise", stage_version="1", code_version="t", config={},
                           config_digest="c", inputs={}, cache_key="k",
                           metrics={"denoise/flip_precision": float("nan"), "ppo/kl": float("inf"), "n": 3.0})
    assert store.manifest(store.lookup("k")).metrics == {"n": 3.0}
    written = json.loads((tmp_path / "store" / "denoised" / ref.digest / MANIFEST).read_text())
    written["metrics"]["denoise/flip_precision"] = None  # as the earlier version wrote it
    (tmp_path / "store" / "denoised" / ref.digest / MANIFEST).write_text(json.dumps(written))
    assert store.manifest(ref).metrics == {"n": 3.0}


def test_an_artifact_whose_path_order_is_not_string_order_verifies_and_an_edited_manifest_does_not(tmp_path):
    """Paths sort by parts ("a/b" before "a-c"), strings by character ("a-c" first): the digest is over the first."""
    import json

    store = ArtifactStore(tmp_path / "store")
    with store.staging() as staged:
        (staged / "a").mkdir()
        (staged / "a" / "b.txt").write_text("nested")
        (staged / "a-c.txt").write_text("beside")
        ref = _commit(store, staged, kind="policy")
    assert list(store.manifest(ref).files) == ["a/b.txt", "a-c.txt", "provenance.json"] and store.verify(ref)
    root = tmp_path / "store" / "policy" / ref.digest
    (root / "a-c.txt").write_text("edited")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"]["a-c.txt"] = content_digest(root)[1]["a-c.txt"]  # the manifest edited to match
    (root / "manifest.json").write_text(json.dumps(manifest))
    assert store.damage(ref) == [f"manifest.json does not hash to digest {ref.digest[:12]} (edited?)"]


def test_a_moved_store_serves_its_own_copies(tmp_path):
    """Cache entries name an artifact by kind and digest: a workdir copied or moved elsewhere reads and removes its
    own copies, not the files at the path it was committed under (gone, or another workdir's)."""
    store = ArtifactStore(tmp_path / "here")
    with store.staging() as staged:
        (staged / "x.txt").write_text("x")
        ref = _commit(store, staged, key="k")
    os.rename(tmp_path / "here", tmp_path / "there")
    moved = ArtifactStore(tmp_path / "there")
    found = moved.lookup("k")
    assert found.path == str((tmp_path / "there" / "prompts" / ref.digest).resolve()) and moved.verify(found)
    assert moved.dangling_cache_entries() == []
    assert moved.remove(found) == ["k"] and moved.lookup("k") is None and moved.committed() == []


def _committed_days_ago(store, ref, key: str, days: float) -> None:
    """Move an artifact's commit time (its manifest's created_at, outside its digest) and its cache entry's back."""
    then = time.time() - days * 86400
    manifest = Path(ref.path) / "manifest.json"
    manifest.write_text(json.dumps(json.loads(manifest.read_text()) | {"created_at": then}))
    os.utime(store.root / "cache" / f"{key}.json", (then, then))


def test_unreferenced_is_what_nothing_recent_or_kept_was_made_from(tmp_path):
    """A garbage collection's plan: kept are the roots given, whatever was committed or served from the cache since
    a time, and the lineage of both; an artifact whose manifest cannot be read is never collected; a model held
    elsewhere (a registry) is not kept for the lineage alone, nor what only it was made from."""
    store = ArtifactStore(tmp_path / "store")

    def commit(name: str, key: str, inputs=None, days_ago: float = 7):
        with store.staging() as staged:
            (staged / "x.txt").write_text(name)
            ref = _commit(store, staged, kind=name.rstrip("0123456789"), inputs=inputs, key=key)
        _committed_days_ago(store, ref, key, days_ago)
        return ref

    world = commit("world", "k-world")
    stale = commit("votes1", "k-stale", {"world": world})  # an old execution nothing uses now
    head_input = commit("comparisons", "k-pairs")
    head = commit("policy1", "k-head", {"pairs": head_input})  # a series' head: a root, however old
    served = commit("votes2", "k-served")
    broken = commit("votes3", "k-broken")
    (tmp_path / "store" / "votes" / broken.digest / "manifest.json").write_text("{")
    old_data = commit("denoised", "k-old-data")
    old_model = commit("reward_model", "k-old-model", {"denoise": old_data})
    assert store.lookup("k-served") == served  # a cache hit is a use
    recent = commit("policy2", "k-recent", {"world": world, "reward": old_model}, days_ago=0.5)  # from old artifacts
    since = time.time() - 86400
    garbage, unreadable = store.unreferenced([head], used_since=since)
    assert garbage == [stale] and unreadable == [broken]
    held = frozenset({(old_model.digest, "reward_model"), (head.digest, "policy")})
    garbage, _ = store.unreferenced([head], used_since=since, held_elsewhere=held)
    assert garbage == [old_data, old_model, stale]  # in kind order; the head stays: it is a root
    garbage, _ = store.unreferenced([], used_since=time.time() + 1)  # nothing recent, no roots
    assert set(garbage) == {world, stale, head_input, head, served, old_data, old_model, recent}
    (tmp_path / "store" / "cache" / "unreadable.json").write_text("{")  # skipped, as lookups skip it
    assert store.remove(stale, stale) == ["k-stale"] and not Path(stale.path).exists()


def test_a_removal_deletes_inputs_before_their_readers_and_with_figures_the_entries_figures(tmp_path, monkeypatch):
    """A cleanup killed half-way must not leave responses whose comparisons are gone: they would look out for
    annotation, and every later cleanup would keep them and all they were made from."""
    store = ArtifactStore(tmp_path / "store")

    def make(kind, key, inputs=None):
        with store.staging() as staged:
            (staged / "t.bin").write_bytes(kind.encode())
            return _commit(store, staged, kind=kind, inputs=inputs, key=key)

    prompts = make("prompts", "kp")
    responses = make("responses", "kr", {"prompts": prompts})
    comparisons = make("comparisons", "kc", {"responses": responses})  # sorts first by kind; read last
    (store.root / "plots" / "kc").mkdir(parents=True)
    (store.root / "plots" / "kc" / "f.png").write_bytes(b"png")
    (store.root / "plots" / "kr").mkdir()
    discarded = []
    real_discard = store._discard
    monkeypatch.setattr(store, "_discard", lambda path: (discarded.append(path.parent.name), real_discard(path)))
    assert store.remove(comparisons, responses, figures=True) == ["kc", "kr"]
    assert discarded == ["responses", "comparisons"]
    assert not (store.root / "plots" / "kc").exists() and not (store.root / "plots" / "kr").exists()
    (store.root / "plots" / "kp").mkdir()
    assert store.remove(prompts) == ["kp"] and (store.root / "plots" / "kp").is_dir()  # verify's: figures stay
    assert store.committed() == []


def test_held_content_digest_is_the_digest_of_the_files_whichever_execution_made_them(tmp_path):
    """Generation names a policy's responses by its weights: two executions that made the same weights (and a
    registry download of them, which has no manifest) name them alike, as the digest did before provenance.json."""
    import shutil

    from rlhf_core.artifacts import MANIFEST, held_content_digest

    store = ArtifactStore(tmp_path / "store")
    refs = []
    for config_digest in ("c1", "c2"):
        with store.staging() as staged:
            (staged / "model.safetensors").write_bytes(b"weights")
            (staged / "config.json").write_text("{}")
            before = content_digest(staged)[0]  # what the artifact's digest was without provenance
            refs.append(store.commit(staged, kind="policy", stage="sft", stage_version="1", code_version="t",
                                     config={}, config_digest=config_digest, inputs={}, cache_key=config_digest))
    download = tmp_path / "download"
    shutil.copytree(refs[0].path, download)
    (download / MANIFEST).unlink()
    held = {held_content_digest(ref) for ref in refs + [ArtifactRef(kind="policy", digest="x", path=str(download))]}
    assert refs[0].digest != refs[1].digest and held == {before}


def test_a_removal_ends_when_hand_edited_manifests_name_each_other_as_inputs(tmp_path):
    """The inputs in a manifest are not hashed: an edit can make a cycle, and the upstream-first order must still
    place every artifact (it looped forever holding the workdir's lock)."""
    store = ArtifactStore(tmp_path / "store")
    refs = []
    for name in ("a", "b"):
        with store.staging() as staged:
            (staged / "t.bin").write_bytes(name.encode())
            refs.append(_commit(store, staged, kind="votes", key=name))
    for ref, other in ((refs[0], refs[1]), (refs[1], refs[0])):
        path = Path(ref.path) / "manifest.json"
        manifest = json.loads(path.read_text())
        manifest["inputs"] = [{"name": "x", "kind": other.kind, "digest": other.digest}]
        path.write_text(json.dumps(manifest))
    assert store.remove(*refs) == ["a", "b"] and store.committed() == []
