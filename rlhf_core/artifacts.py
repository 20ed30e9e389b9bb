"""A content-addressed artifact store with manifests and atomic writes.

Layout under `root`:
    <kind>/<digest>/...            the artifact's files + provenance.json + manifest.json (a Parquet table, an HF
                                   model dir, ...)
    cache/<cache_key>.json         which artifact a (stage, stage version, config, inputs) produced
    .staging/<random>/             where a stage writes before its artifact is committed
    plots/<cache_key>/*.png        the figures the stage execution logged (shown again on a cache hit)

A stage writes into a staging directory; `commit` hashes every file, writes the manifest and
renames the directory into place in one `os.rename`, so a killed stage never leaves a half
artifact where a later stage would read it. The digest covers the whole content (every byte of
every file, and the relative paths), not a sample of it. It covers provenance.json too, which names the
execution (the cache key's stage, version, config digest and inputs): two executions that write the same
tables are two artifacts, each with its own manifest (its metrics, its inputs), never one manifest speaking
for both.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from pydantic import BaseModel, ConfigDict, Field, field_validator

MANIFEST = "manifest.json"
PROVENANCE = "provenance.json"
STORE_DIRS = {"cache", ".staging", "plots"}  # beside the kinds' directories, not artifacts


class DamagedArtifactError(RuntimeError):
    """A committed artifact whose files changed since its commit (`ArtifactStore.damage` says how)."""


class ArtifactRef(BaseModel):
    """A pointer to a committed artifact; small and serialisable (it is what Prefect tasks return)."""

    model_config = ConfigDict(frozen=True)

    kind: str = Field(description="what the artifact holds: prompts, responses, comparisons, votes, policy, ...")
    digest: str = Field(description="sha256 of its content (the store's directory name)")
    path: str = Field(description="its directory, under the workdir's artifacts/{kind}/{digest}")

    def file(self, name: str) -> Path:
        return Path(self.path) / name


class InputRef(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    kind: str
    digest: str


class Manifest(BaseModel):
    kind: str
    digest: str
    schema_version: int
    stage: str
    stage_version: str
    code_version: str
    config: dict[str, Any]
    config_digest: str
    inputs: list[InputRef]
    cache_key: str
    files: dict[str, str]  # relative path -> sha256
    metrics: dict[str, float] = {}
    created_at: float

    @field_validator("metrics", mode="before")
    @classmethod
    def _finite_metrics_only(cls, metrics: Any) -> Any:
        """A metric that is not a finite number (NaN where there was nothing to measure, e.g. flip precision when
        nothing was flipped) is left out: JSON has no NaN, so it was written as null, and an earlier version then
        failed to read its own manifest back (the artifact committed, its cache entry served, every run failing)."""
        if not isinstance(metrics, dict):
            return metrics
        return {k: v for k, v in metrics.items()
                if v is not None and not (isinstance(v, (int, float)) and not math.isfinite(v))}


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def content_digest(root: Path) -> tuple[str, dict[str, str]]:
    """sha256 over (relative path, file sha256) of every file under root except the manifest."""
    files = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and rel != MANIFEST:
            files[rel] = sha256_file(p)
    return files_digest(files), files


def files_digest(files: dict[str, str]) -> str:
    """The artifact's digest from its files' sha256 (relative path -> sha256), in the order given: content_digest's
    (sorted Paths, which is not sorted strings: "a/b" before "a-c") and so the manifest's."""
    h = hashlib.sha256()
    for rel, digest in files.items():
        h.update(f"{rel}\0{digest}\n".encode())
    return h.hexdigest()


def cache_key(stage: str, stage_version: str, config_digest: str, input_digests: dict[str, str]) -> str:
    """The identity of a stage execution: same stage code, config and inputs give the same key."""
    blob = json.dumps(
        {"stage": stage, "version": stage_version, "config": config_digest, "inputs": input_digests},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def write_provenance(staged: Path, stage: str, stage_version: str, config_digest: str,
                     input_digests: dict[str, str]) -> None:
    """The execution that made an artifact, as its content: the ingredients of its cache key."""
    record = {"stage": stage, "stage_version": stage_version, "config_digest": config_digest,
              "inputs": dict(sorted(input_digests.items()))}
    (staged / PROVENANCE).write_text(json.dumps(record, indent=2) + "\n")


def manifest_of(ref: ArtifactRef) -> Manifest | None:
    """The manifest in an artifact's directory, whichever store it is in; None for a directory without one (a
    registry download)."""
    path = Path(ref.path) / MANIFEST
    return Manifest.model_validate_json(path.read_text()) if path.is_file() else None


def held_content_digest(ref: ArtifactRef) -> str:
    """The digest of what an artifact holds, without its provenance: the same for two executions that made the same
    files (the artifact's digest before provenance.json existed). From its manifest; a directory without one (a
    registry download) is hashed."""
    manifest = manifest_of(ref)
    files = manifest.files if manifest is not None else content_digest(Path(ref.path))[1]
    return files_digest({rel: sha for rel, sha in files.items() if rel != PROVENANCE})


def umask() -> int:
    """This process's umask, read without changing it (Linux: /proc; elsewhere the common 022)."""
    try:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("Umask:"))
        return int(line.split()[1], 8)
    except (OSError, StopIteration, ValueError):
        return 0o022


def as_plainly_created(root: Path) -> None:
    """Give every file and directory under `root` (and `root` itself) the mode a plain open() or mkdir() would: a
    temp file (mkstemp, as safetensors and our atomic writes use) is 0600 and a temp directory (mkdtemp, the store's
    staging) 0700, so a team's other accounts (a Prefect worker, an MLflow server) could not read a committed
    model's weights."""
    file_mode, dir_mode = 0o666 & ~umask(), 0o777 & ~umask()
    for path in [root, *root.rglob("*")] if root.is_dir() else [root]:
        if path.is_symlink():
            continue
        mode = dir_mode if path.is_dir() else file_mode if path.is_file() else None
        if mode is not None and (path.stat().st_mode & 0o777) != mode:
            os.chmod(path, mode)


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """Write a file so that readers see either the old content or the whole new one:
    `write` fills a temp file in the same directory, which is fsynced and renamed over `path` (with the mode a
    plain open() gives, not the temp file's 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        as_plainly_created(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (a rename into it) to disk; a no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file under `root`, and its directories, to disk: a process killed later loses nothing, but
    only fsync makes the content outlive a power loss."""
    for path in sorted(root.rglob("*")):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        elif path.is_dir():
            fsync_dir(path)
    fsync_dir(root)


class ArtifactStore:
    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def holds(self, ref: ArtifactRef) -> bool:
        """Whether `ref` is one of this store's artifacts (root/kind/digest), not a directory elsewhere (a
        registry download, which has no manifest)."""
        return Path(ref.path).resolve().parent.parent == self.root

    @contextmanager
    def staging(self) -> Iterator[Path]:
        """A fresh directory to write an artifact into; removed if not committed."""
        base = self.root / ".staging"
        base.mkdir(exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=base))
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def sweep_staging(self) -> int:
        """Remove the staging directories a killed process left; returns how many. Call it only while no
        other process writes into this store (a round holds its workdir's lock)."""
        left = [p for p in (self.root / ".staging").glob("*") if p.is_dir()]
        for path in left:
            shutil.rmtree(path, ignore_errors=True)
        return len(left)

    def commit(
        self,
        staged: Path,
        *,
        kind: str,
        stage: str,
        stage_version: str,
        code_version: str,
        config: dict[str, Any],
        config_digest: str,
        inputs: dict[str, ArtifactRef],
        cache_key: str,
        schema_version: int = 1,
        metrics: dict[str, float] | None = None,
    ) -> ArtifactRef:
        """Hash the staged content and its provenance, write its manifest, move it into place and index its
        cache key."""
        if not any(p.is_file() for p in staged.rglob("*")):
            raise ValueError(f"refusing to commit an empty {kind} artifact from stage {stage}")
        write_provenance(staged, stage, stage_version, config_digest, {n: r.digest for n, r in inputs.items()})
        digest, files = content_digest(staged)
        manifest = Manifest(
            kind=kind,
            digest=digest,
            schema_version=schema_version,
            stage=stage,
            stage_version=stage_version,
            code_version=code_version,
            config=config,
            config_digest=config_digest,
            inputs=[InputRef(name=n, kind=r.kind, digest=r.digest) for n, r in sorted(inputs.items())],
            cache_key=cache_key,
            files=files,
            metrics=metrics or {},
            created_at=time.time(),
        )
        (staged / MANIFEST).write_text(manifest.model_dump_json(indent=2))
        as_plainly_created(staged)  # readable by the team as any file they write (safetensors writes 0600)
        fsync_tree(staged)  # on disk before the cache entry points at it, even across a power loss
        target = self.root / kind / digest
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() and self.damage(ArtifactRef(kind=kind, digest=digest, path=str(target)), hash_files=False):
            self._discard(target)  # a damaged copy of this very content (files gone or added): the new one replaces it
        if not target.exists():
            try:
                os.rename(staged, target)
            except OSError:
                if not target.exists():  # lost a race to an identical artifact otherwise
                    raise
            fsync_dir(target.parent)  # the rename itself
        ref = ArtifactRef(kind=kind, digest=digest, path=str(target))
        atomic_write_text(self.root / "cache" / f"{cache_key}.json", ref.model_dump_json())
        return ref

    def _entry_ref(self, entry: Path) -> ArtifactRef:
        """The artifact a cache entry names, in this store: a workdir copied or moved elsewhere serves its own copies,
        not the files at the path the entry was written with."""
        ref = ArtifactRef.model_validate_json(entry.read_text())
        return ref.model_copy(update={"path": str(self.root / ref.kind / ref.digest)})

    def _entries(self) -> Iterator[tuple[Path, ArtifactRef]]:
        """Every cache entry that reads, with the artifact it names; one that does not read is a miss to lookups and
        is skipped here."""
        for entry in sorted((self.root / "cache").glob("*.json")):
            try:
                yield entry, self._entry_ref(entry)
            except (OSError, ValueError):
                continue

    def lookup(self, key: str) -> ArtifactRef | None:
        """The artifact a finished stage execution with this cache key produced, if it is intact (its manifest and
        every file it lists there, nothing else: a cheap check; `damage(ref)` hashes every byte)."""
        entry = self.root / "cache" / f"{key}.json"
        if not entry.is_file():
            return None
        ref = self._entry_ref(entry)
        if self.damage(ref, hash_files=False):  # a manifest gone or unreadable, or files gone or added
            return None
        try:  # the entry's time is when the execution last ran or was served: what `unreferenced` keeps recent work by
            os.utime(entry)
        except OSError:  # a store read, not written (another user's, a read-only mount): nothing to note
            pass
        return ref

    def manifest(self, ref: ArtifactRef) -> Manifest:
        return Manifest.model_validate_json((Path(ref.path) / MANIFEST).read_text())

    def verify(self, ref: ArtifactRef) -> bool:
        """True if no byte changed since commit (every file hashed against the manifest)."""
        return not self.damage(ref)

    def damage(self, ref: ArtifactRef, hash_files: bool = True) -> list[str]:
        """What changed in a committed artifact since its commit, one line each (empty when intact): its manifest
        unreadable or naming another digest, files missing or added, and (`hash_files`) files whose bytes changed."""
        root = Path(ref.path)
        try:
            manifest = Manifest.model_validate_json((root / MANIFEST).read_text())
        except (OSError, ValueError) as err:
            return [f"{MANIFEST} unreadable ({type(err).__name__})"]
        if manifest.digest != ref.digest or files_digest(manifest.files) != ref.digest:
            return [f"{MANIFEST} does not hash to digest {ref.digest[:12]} (edited?)"]
        present = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} - {MANIFEST}
        problems = [f"{rel}: missing" for rel in sorted(set(manifest.files) - present)]
        problems += [f"{rel}: not in the manifest" for rel in sorted(present - set(manifest.files))]
        if hash_files:
            problems += [f"{rel}: changed (sha256 {sha256_file(root / rel)[:12]}, committed {sha[:12]})"
                         for rel, sha in sorted(manifest.files.items())
                         if rel in present and sha256_file(root / rel) != sha]
        return problems

    def remove(self, *refs: ArtifactRef, figures: bool = False) -> list[str]:
        """Delete artifacts (damaged ones, garbage) and the cache entries that point at them, so the stage executions
        that made them run again; with `figures`, the figures kept for those entries too (plots/<key>). Returns the
        cache keys removed. Call it only while no other process uses this store (a round holds its workdir's lock).

        Upstream artifacts go before those that read them: a removal killed half-way leaves readers without their
        inputs (garbage to the next collection), never inputs without their readers (responses no comparisons
        read look out for annotation, and would be kept with all they were made from)."""
        gone = {(ref.kind, ref.digest) for ref in refs}
        keys = []
        for entry, named in self._entries():  # first: a cache entry never points at a half-deleted artifact
            if (named.kind, named.digest) in gone:
                entry.unlink()
                keys.append(entry.stem)
                if figures:
                    shutil.rmtree(self.root / "plots" / entry.stem, ignore_errors=True)
        for kind, digest in self._upstream_first(gone):
            self._discard(self.root / kind / digest)
        return sorted(keys)

    def _upstream_first(self, artifacts: set[tuple[str, str]]) -> list[tuple[str, str]]:
        """(kind, digest) pairs ordered so that each comes after those of them it was made from."""
        inputs: dict[tuple[str, str], set[tuple[str, str]]] = {}
        for kind, digest in artifacts:
            try:
                manifest = self.manifest(ArtifactRef(kind=kind, digest=digest, path=str(self.root / kind / digest)))
                inputs[kind, digest] = {(i.kind, i.digest) for i in manifest.inputs} & artifacts
            except (OSError, ValueError):  # unreadable (damaged): no known inputs
                inputs[kind, digest] = set()
        ordered: list[tuple[str, str]] = []
        placed: set[tuple[str, str]] = set()
        while len(placed) < len(inputs):
            ready = sorted(a for a in inputs if a not in placed and inputs[a] <= placed)
            if not ready:  # a cycle, which only hand-edited manifests make: the rest in any order
                ready = sorted(a for a in inputs if a not in placed)
            ordered += ready
            placed |= set(ready)
        return ordered

    def _discard(self, path: Path) -> None:
        """Move a directory out of the store's tree in one rename, then delete it."""
        base = self.root / ".staging"
        base.mkdir(exist_ok=True)
        aside = Path(tempfile.mkdtemp(dir=base, prefix="removed-"))
        os.rename(path, aside / path.name)
        shutil.rmtree(aside, ignore_errors=True)

    def find(self, kind: str, digest: str) -> ArtifactRef:
        path = self.root / kind / digest
        if not (path / MANIFEST).is_file():
            raise FileNotFoundError(f"no {kind} artifact {digest} under {self.root}")
        return ArtifactRef(kind=kind, digest=digest, path=str(path))

    def committed(self) -> list[ArtifactRef]:
        """Every artifact directory of every kind (also one whose manifest is unreadable), in kind, digest order."""
        kinds = [d for d in sorted(self.root.iterdir()) if d.is_dir() and d.name not in STORE_DIRS]
        return [ArtifactRef(kind=k.name, digest=d.name, path=str(d)) for k in kinds for d in sorted(k.iterdir())
                if d.is_dir()]

    def dangling_cache_entries(self) -> list[Path]:
        """Cache entries whose artifact directory is gone (e.g. deleted by hand): lookups treat them as misses. (A
        directory there without its manifest is a damaged artifact, which `committed` lists and `damage` names.)"""
        return [entry for entry, ref in self._entries() if not Path(ref.path).is_dir()]

    def artifacts(self, kind: str) -> list[ArtifactRef]:
        """Every committed artifact of `kind`, in digest order."""
        return [self.find(kind, d.name) for d in sorted((self.root / kind).glob("*")) if (d / MANIFEST).is_file()]

    def unreferenced(self, roots: list[ArtifactRef], used_since: float,
                     held_elsewhere: frozenset[tuple[str, str]] = frozenset()
                     ) -> tuple[list[ArtifactRef], list[ArtifactRef]]:
        """What a garbage collection may delete: every artifact that is neither kept nor upstream of a kept one, the
        kept being `roots` and every artifact committed, or made or served by a cache lookup, at or after `used_since`
        (a Unix time). `held_elsewhere` ((digest, kind) pairs: models a registry holds) are artifacts the walk up a
        kept artifact's lineage leaves behind: collected unless kept themselves, their own inputs kept only where
        something else needs them. Returns (unreferenced, unreadable): an artifact whose manifest cannot be read is
        never called unreferenced (its inputs are unknown); `rlhf verify --remove` deals with it."""
        used: dict[tuple[str, str], float] = {}  # (digest, kind) -> when a cache entry of it was last written or used
        for entry, ref in self._entries():
            used[ref.digest, ref.kind] = max(used.get((ref.digest, ref.kind), 0.0), entry.stat().st_mtime)
        manifests, unreadable = {}, []
        for ref in self.committed():
            try:
                manifests[ref.digest, ref.kind] = self.manifest(ref)
            except (OSError, ValueError):
                unreadable.append(ref)
        recent = [key for key, m in manifests.items() if max(m.created_at, used.get(key, 0.0)) >= used_since]
        kept: set[tuple[str, str]] = set()
        start = {(r.digest, r.kind) for r in roots} | set(recent)
        todo = list(start)
        while todo:  # the kept artifacts' lineage, through inputs the store holds
            key = todo.pop()
            if key in kept or (key in held_elsewhere and key not in start):
                continue
            kept.add(key)
            if key in manifests:
                todo += [(i.digest, i.kind) for i in manifests[key].inputs]
        garbage = [self.find(kind, digest) for (digest, kind) in manifests if (digest, kind) not in kept]
        return sorted(garbage, key=lambda r: (r.kind, r.digest)), unreadable

    def lineage(self, ref: ArtifactRef) -> list[Manifest]:
        """This artifact's manifest and every upstream manifest, walking input digests (depth first)."""
        seen: dict[str, Manifest] = {}
        stack = [ref]
        while stack:
            r = stack.pop()
            if r.digest in seen:
                continue
            m = self.manifest(r)
            seen[r.digest] = m
            stack.extend(self.find(i.kind, i.digest) for i in m.inputs)
        return list(seen.values())
