"""MLflow tracking with explicit run ids.

MLflow's fluent "active run" is thread-local and Prefect runs tasks in worker threads, so nothing
here relies on it: every call names its run id through `MlflowClient`. One parent run per round,
one nested run per stage (`mlflow.parentRunId` tag). Secrets never reach params or tags:
`flatten_params` drops any key that looks like a credential.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import threading
import time
import warnings
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import mlflow
import pandas as pd
from mlflow import MlflowClient
from mlflow.entities import (DatasetInput, InputTag, LoggedModelInput, LoggedModelOutput, LoggedModelStatus, Metric,
                             Param, RunTag)
from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

from rlhf_core.artifacts import atomic_write
from rlhf_core.config import ConfigError, no_credentials_in_url, url_without_userinfo

log = logging.getLogger("rlhf")
# a key that may name or hold a credential; "token" only as a word of the key (hf_token, access_token), so that
# counts of tokens (max_new_tokens, max_tokens) are still logged
SECRET_KEY = re.compile(r"(api[_-]?key|secret|password|credential|(^|[_.-])token($|[_.-]))", re.IGNORECASE)
# The experiment's kind: MLflow 3 asks which kind an experiment without it is, and heads its runs "Training runs"
EXPERIMENT_KIND, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"
# The UI's GenAI / model-training switch (MLflow 3.17) is not read from that tag: it is the link's `workflowType`
# query parameter, else the browser's last choice, else GenAI. Links into the UI carry it.
UI_MODEL_TRAINING = "workflowType=machine_learning"
ALIAS_PENDING = "rlhf.alias_pending"  # a new model version's tag until it holds the alias it was registered for
MODEL_VERSIONS = "mlflow.modelVersions"  # a logged model's tag naming its registered versions (as MLflow writes it)
_PROCESS_TRACKING_URI = threading.Lock()  # held while MLflow's process-wide tracking URI is pointed elsewhere


def default_tracking_uri(workdir: str | Path) -> str:
    """An explicit URI wins (env MLFLOW_TRACKING_URI, refused with a credential in it as the config's tracking_uri
    is: the URI is shown in run links, summaries and messages); else a SQLite store under the workdir."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        try:
            return no_credentials_in_url(env)
        except ValueError as err:
            raise ConfigError(f"MLFLOW_TRACKING_URI: {err}") from None
    return f"sqlite:///{(Path(workdir).resolve() / 'mlflow.db').as_posix()}"


# What a registered model's pyfunc needs installed beside its own copy of rlhf_core (pinned as installed here)
SERVING_REQUIREMENTS = ("mlflow", "torch", "transformers", "safetensors", "tokenizers", "numpy", "pandas", "pydantic",
                        "pyyaml")


# What write_pyfunc_files adds beside a model's own files, and what MLflow writes into a registered model it downloads
PYFUNC_FILES = ("MLmodel", "code", "requirements.txt", "python_env.yaml", "registered_model_meta")


def serving_config(kind: str, stage_config: dict[str, Any]) -> dict[str, Any]:
    """The pyfunc's `model_config` for a model artifact: its kind and the stage's lengths (the reward model reads
    prompt + response as it was trained to, max_length; the PPO policy answers up to PPO's max_new_tokens, the SFT
    policy, whose stage has none, up to serving.POLICY_DEFAULTS')."""
    from rlhf_core import serving

    if kind == serving.REWARD_MODEL:
        length = stage_config.get("reward", {}).get("train", {}).get("max_length")
        return {"kind": kind, "max_length": int(length or serving.REWARD_DEFAULTS["max_length"])}
    length = stage_config.get("ppo", {}).get("max_new_tokens")
    return {"kind": serving.POLICY, "max_new_tokens": int(length or serving.POLICY_DEFAULTS["max_new_tokens"])}


def write_pyfunc_files(folder: Path, run_id: str, model_id: str, name: str, model_config: dict[str, Any]) -> None:
    """Into `folder`: the MLmodel file of a pyfunc whose loader is rlhf_core.serving (the model's own files sit
    beside it: its data path is the model's root), its input, output and parameter schema, the Python environment,
    and under code/ the rlhf_core that trained it, so the model is served by the code that made it."""
    import platform
    import shutil
    from importlib.metadata import PackageNotFoundError, version

    import mlflow.pyfunc
    from mlflow.models import Model, ModelSignature
    from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

    import rlhf_core
    from rlhf_core import serving

    reward = model_config["kind"] == serving.REWARD_MODEL
    columns, outputs = (("prompt", "response"), "reward") if reward else (("prompt",), "response")
    defaults = serving.settings_defaults(model_config["kind"], model_config)
    signature = ModelSignature(
        inputs=Schema([ColSpec("string", c) for c in columns]),
        outputs=Schema([ColSpec("double" if reward else "string", outputs)]),
        params=ParamSchema([ParamSpec(k, "long" if isinstance(v, int) else "double", v) for k, v in defaults.items()]))
    package = Path(rlhf_core.__file__).parent  # its .py files only (all it has): no file someone left beside them
    shutil.copytree(package, folder / "code" / "rlhf_core", ignore=lambda folder, names: [
        n for n in names if n == "__pycache__" or (not n.endswith(".py") and not (Path(folder) / n).is_dir())])
    pins = []
    for package in SERVING_REQUIREMENTS:
        try:
            pins.append(f"{package}=={version(package).split('+')[0]}")  # 2.13.0+cpu: the build is the machine's
        except PackageNotFoundError:
            pins.append(package)
    (folder / "requirements.txt").write_text("\n".join(pins) + "\n")
    (folder / "python_env.yaml").write_text(f"python: {platform.python_version()}\nbuild_dependencies:\n- pip\n"
                                            "- setuptools\n- wheel\ndependencies:\n- -r requirements.txt\n")
    model = Model(artifact_path=name, run_id=run_id, model_id=model_id, signature=signature)
    mlflow.pyfunc.add_to_model(model, loader_module="rlhf_core.serving", code="code", python_env="python_env.yaml",
                               model_config=dict(model_config))
    model.save(str(folder / "MLmodel"))


_PLAIN_ID = re.compile(r"[0-9A-Za-z-]+")  # a Prefect flow run id (a UUID): safe inside a filter string


class TrackingUnavailableError(RuntimeError):
    """The configured MLflow tracking server does not answer; raised before any work starts."""


def check_tracking_server(uri: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, with one line, when an http(s) tracking URI does not answer its /health.

    MlflowClient itself retries a dead server for minutes before failing; a local store needs no check.
    """
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s) as response:
            if response.status == 200:
                return
            problem = f"HTTP {response.status}"
    except urllib.error.HTTPError as err:
        problem = f"HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:
        problem = str(getattr(err, "reason", err))
    raise TrackingUnavailableError(
        f"the MLflow tracking server {url_without_userinfo(uri)} does not answer ({problem}): start it (bash infra/services.sh start), "
        "or unset MLFLOW_TRACKING_URI / tracking_uri to log to <workdir>/mlflow.db"
    )


def flatten_params(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """{"ppo": {"kl_coef": 0.05}} -> {"ppo.kl_coef": "0.05"}; secret-looking keys are dropped.

    A list or tuple is written as JSON (["+", "-"] whichever a stage's config dump holds, so one search finds every
    stage's); a value over MLflow's limit is cut visibly, with its length, never silently."""
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if SECRET_KEY.search(str(key)):
            continue
        if isinstance(value, dict):
            out.update(flatten_params(value, prefix=f"{name}."))
            continue
        text = json.dumps(value, default=str) if isinstance(value, (list, tuple)) else str(value)
        if len(text) > MAX_PARAM_VAL_LENGTH:
            mark = f" ... [cut: {len(text)} characters]"
            text = text[:MAX_PARAM_VAL_LENGTH - len(mark)] + mark
        out[name] = text
    return out


class Tracker:
    """The few MLflow operations the pipeline needs, each taking the run id explicitly."""

    def __init__(self, tracking_uri: str, experiment: str, artifact_root: str | Path | None = None):
        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            # a local store keeps artifacts beside the run files; a tracking server decides for itself
            local = not tracking_uri.startswith(("http://", "https://", "databricks"))
            if artifact_root is None and tracking_uri.startswith("sqlite:///"):  # beside the database, as a round
                artifact_root = Path(tracking_uri.removeprefix("sqlite:///")).parent / "mlartifacts"  # puts them;
                # MLflow's default is ./mlruns in whatever directory the process happens to run in
            location = Path(artifact_root).resolve().as_uri() if artifact_root and local else None
            self.experiment_id = self.client.create_experiment(experiment, artifact_location=location,
                                                               tags={EXPERIMENT_KIND: MODEL_TRAINING})
        else:
            self.experiment_id = exp.experiment_id
            if EXPERIMENT_KIND not in exp.tags:
                self.client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND, MODEL_TRAINING)

    # ------------------------------------------------------------ runs
    def start_run(self, name: str, tags: dict[str, str], parent_run_id: str | None = None) -> str:
        tags = dict(tags)
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        return run.info.run_id

    def log_model_inputs(self, run_id: str, digests: list[str]) -> None:
        """The logged models of these artifact digests (tag rlhf.digest) as the run's model inputs: the UI then draws
        which models a stage read (a policy, a reward model). A model this experiment never logged is left out."""
        models = []
        for digest in digests:
            found = self.client.search_logged_models([self.experiment_id], max_results=1,
                                                     filter_string=f"tags.`rlhf.digest` = '{digest}'")
            models += [LoggedModelInput(model_id=found[0].model_id)] if found else []
        if models:
            self.client.log_inputs(run_id, models=models)

    def producing_run(self, output: str):
        """The first run of this experiment that made `output` (`kind:digest`, a stage's tag rlhf.output), or None
        (made in another experiment or store)."""
        runs = self.client.search_runs([self.experiment_id], max_results=1, order_by=["attributes.start_time ASC"],
                                       filter_string=f"tags.`rlhf.output` = '{output}' and tags.`rlhf.cache` = 'miss'")
        return runs[0] if runs else None

    def run_url(self, run_id: str) -> str:
        """The run's page on the MLflow server; "" for a local store (it has no UI address of its own)."""
        if self.tracking_uri.startswith(("http://", "https://")):
            return f"{self.tracking_uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{run_id}?{UI_MODEL_TRAINING}"
        return ""

    def run_link(self, run_id: str) -> str:
        """Markdown pointing at the run: a link into the MLflow UI for a tracking server, else the run id
        and the store."""
        if url := self.run_url(run_id):
            return f"[MLflow run {run_id}]({url})"
        return f"MLflow run `{run_id}` (experiment {self.experiment_id} in `{self.tracking_uri}`)"

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)

    def close_killed_runs(self, workdir: str, flow_runs: set[str], tag: str = "rlhf.workdir") -> int:
        """Mark KILLED the runs still RUNNING whose `tag` is `workdir` and whose Prefect flow run (the tag
        prefect.flow_run_id) is one of `flow_runs`: those a killed holder of the workdir's lock noted as its own.
        Also FAILED the logged models they left PENDING. Called under the workdir's lock. The workdir alone does
        not tell a killed run from a live one: two machines (pods) may hold the same path on one shared MLflow
        server. Returns how many runs."""
        if not flow_runs:
            return 0
        # by flow run (a UUID) in the filter, by workdir here: a path may hold a quote, which broke the filter string
        running = [run for flow_run_id in sorted(flow_runs) if _PLAIN_ID.fullmatch(flow_run_id)
                   for run in self.client.search_runs(
                       [self.experiment_id], max_results=1000,
                       filter_string=f"attributes.status = 'RUNNING' and tags.`prefect.flow_run_id` = '{flow_run_id}'")]
        stale = [run for run in running if run.data.tags.get(tag) == workdir]
        for run in stale:
            self.client.set_terminated(run.info.run_id, status="KILLED")
            models = self.client.search_logged_models([self.experiment_id],
                                                      filter_string=f"source_run_id = '{run.info.run_id}'")
            for model in models:
                if model.status == LoggedModelStatus.PENDING:
                    self.client.finalize_logged_model(model.model_id, "FAILED")
        return len(stale)

    # ------------------------------------------------------------ logging
    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        flat = flatten_params(params)
        items = [Param(k, v) for k, v in flat.items()]
        for i in range(0, len(items), 100):  # MLflow caps params per batch
            self.client.log_batch(run_id, params=items[i : i + 100], synchronous=True)

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0, model_id: str | None = None) -> None:
        """Numbers (NaN and non-numbers skipped) at `step`; with `model_id`, linked to that logged model too."""
        now = int(time.time() * 1000)
        items = [Metric(_metric_name(k), float(v), now, step, model_id=model_id)
                 for k, v in metrics.items() if _is_number(v)]
        for i in range(0, len(items), 500):
            self.client.log_batch(run_id, metrics=items[i : i + 500], synchronous=True)

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        items = [RunTag(k, str(v)) for k, v in tags.items() if not SECRET_KEY.search(k)]
        self.client.log_batch(run_id, tags=items, synchronous=True)

    def log_table_input(self, run_id: str, df: pd.DataFrame, *, path: Path, name: str, digest: str,
                        context: str = "input") -> None:
        """Log a table as a run input; the digest is ours, over the full artifact content."""
        # MLflow warns that a local path matches two equivalent source types and that integer
        # columns cannot hold missing values (ours never do): harmless here, noise on the console.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dataset = mlflow.data.from_pandas(df, source=str(path), name=name, digest=digest[:36])
            entity = dataset._to_mlflow_entity()
        tag = InputTag(key="mlflow.data.context", value=context)
        self.client.log_inputs(run_id, datasets=[DatasetInput(entity, tags=[tag])])

    def log_artifacts(self, run_id: str, local_dir: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifacts(run_id, str(local_dir), artifact_path)

    def log_artifact(self, run_id: str, local_path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(local_path), artifact_path)

    def log_figure(self, run_id: str, fig, name: str, keep_in: Path | None = None) -> None:
        """Save a matplotlib figure under the run's plots/ and close it (pyplot keeps figures alive);
        `keep_in`: a directory that keeps the PNG too (a cache hit logs it again)."""
        import matplotlib.pyplot as plt

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            fig.savefig(path, dpi=100, bbox_inches="tight")
            self.client.log_artifact(run_id, str(path), "plots")
            if keep_in is not None:
                keep_in.mkdir(parents=True, exist_ok=True)
                atomic_write(keep_in / name, lambda f: f.write(path.read_bytes()))
        plt.close(fig)

    def register_model(self, run_id: str, model_dir: Path, name: str, alias: str, tags: dict[str, str],
                       params: dict[str, Any] | None = None, metrics: dict[str, float] | None = None,
                       pyfunc: dict[str, Any] | None = None) -> int:
        """Log an HF model directory as an MLflow 3 logged model of the run and register it under `name` with
        `alias`; the run's metrics are logged linked to the model. Returns the registered version.
        `pyfunc`: the model's kind and defaults (`serving_config`); with it the model also gets an MLmodel file, so
        `mlflow.pyfunc.load_model("models:/<name>@<alias>")` and `mlflow models serve` work on it (rlhf_core.serving).

        A digest (tags["rlhf.digest"]) is registered once: when `name` already has a version for it (a cache
        hit, a re-run after a kill), the run links to that version's logged model, and the version gets the alias
        only when no version holds it: a cached re-run of an old config does not move `candidate` back to its old
        model (`candidate` is the version a stage last trained). A new version carries ALIAS_PENDING until its alias
        is set: a run killed in between gives it the alias when run again (it kept `candidate` on the old model)."""
        try:
            self.client.get_registered_model(name)
        except mlflow.exceptions.MlflowException:
            self.client.create_registered_model(name)
        tags = {k: str(v) for k, v in tags.items() if not SECRET_KEY.search(k)}
        digest, params, metrics = tags.get("rlhf.digest"), params or {}, metrics or {}
        version = self.model_version(name, digest) if digest is not None else None
        if version is None:
            model_id = self._new_logged_model(run_id, model_dir, name, tags, params, metrics, pyfunc)
            with self._registry_resolves_models_uris():
                version = self.client.create_model_version(name, source=f"models:/{model_id}", run_id=run_id,
                                                           tags=tags | {ALIAS_PENDING: alias}, model_id=model_id)
            # what mlflow.register_model records: the logged model's page lists its registered versions
            self.client.set_logged_model_tags(model_id, {MODEL_VERSIONS: json.dumps([{"name": name,
                                                                                      "version": version.version}])})
        else:
            if (model_id := logged_model_id(version)) is not None:
                self.client.log_outputs(run_id, [LoggedModelOutput(model_id, step=0)])
                if pyfunc is not None and not any(f.path == "MLmodel" for f in
                                                  self.client.list_logged_model_artifacts(model_id)):
                    # registered before models were pyfuncs (2026-11-29): the version a cache hit reuses gets one
                    self._add_pyfunc(model_id, run_id, name, pyfunc)
            self.log_metrics(run_id, metrics)
            if version.tags.get(ALIAS_PENDING) != alias and self.aliased_version(name, alias) is not None:
                return int(version.version)
        self.client.set_registered_model_alias(name, alias, version.version)
        if ALIAS_PENDING in version.tags:
            self.client.delete_model_version_tag(name, version.version, ALIAS_PENDING)
        return int(version.version)

    def _new_logged_model(self, run_id: str, model_dir: Path, name: str, tags: dict[str, str],
                          params: dict[str, Any], metrics: dict[str, float],
                          pyfunc: dict[str, Any] | None = None) -> str:
        """A logged model of the run holding `model_dir`'s files, its params and the run's metrics; READY once
        everything is in, FAILED when anything fails on the way (a killed process leaves it PENDING, and the
        next round in the workdir marks it FAILED with the run)."""
        model = self.client.create_logged_model(
            self.experiment_id, name=name, source_run_id=run_id, model_type=tags.get("rlhf.stage"),
            tags=tags, params=flatten_params(params))
        try:
            if not (model_dir / "config.json").is_file():  # MLflow would upload an empty directory without a word
                raise FileNotFoundError(f"{model_dir} holds no model (no config.json): nothing to log as {name}")
            self.client.log_model_artifacts(model.model_id, str(model_dir))
            if pyfunc is not None:
                self._add_pyfunc(model.model_id, run_id, name, pyfunc)
            self.client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=0)])
            self.log_metrics(run_id, metrics, model_id=model.model_id)
        except BaseException:
            self.client.finalize_logged_model(model.model_id, "FAILED")
            raise
        self.client.finalize_logged_model(model.model_id, "READY")
        return model.model_id

    def _add_pyfunc(self, model_id: str, run_id: str, name: str, pyfunc: dict[str, Any]) -> None:
        """The logged model's MLmodel file, environment and code (write_pyfunc_files), beside its own files."""
        with tempfile.TemporaryDirectory() as tmp:
            write_pyfunc_files(Path(tmp), run_id, model_id, name, pyfunc)
            self.client.log_model_artifacts(model_id, tmp)

    @contextmanager
    def _registry_resolves_models_uris(self) -> Iterator[None]:
        """MLflow's SQL registry store resolves a `models:/<model_id>` source through the process-wide tracking
        URI (it calls MlflowClient() with no URI), not through this client's: point that URI here while a version
        is created, then put it back, and the environment variable mlflow.set_tracking_uri mirrors it into. A
        tracking server resolves the source against its own store."""
        if self.tracking_uri.startswith(("http://", "https://")):
            yield
            return
        from mlflow.tracking._tracking_service import utils

        with _PROCESS_TRACKING_URI:
            saved_uri, saved_env = utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
            mlflow.set_tracking_uri(self.tracking_uri)
            try:
                yield
            finally:
                mlflow.set_tracking_uri(saved_uri)
                if saved_env is not None:
                    os.environ["MLFLOW_TRACKING_URI"] = saved_env

    def model_version(self, name: str, digest: str):
        """The first version of registered model `name` whose `rlhf.digest` tag is `digest`, or None."""
        try:
            versions = self.client.search_model_versions(f"name = '{name}'")
        except mlflow.exceptions.MlflowException:  # no such registered model
            return None
        known = [v for v in versions if v.tags.get("rlhf.digest") == digest]
        return min(known, key=lambda v: int(v.version)) if known else None

    def aliased_version(self, name: str, alias: str):
        """The version of `name` that holds `alias` (e.g. rlhf-policy@champion), or None while none does."""
        try:
            return self.client.get_model_version_by_alias(name, alias)
        except mlflow.exceptions.MlflowException:  # no such model, or the alias is on no version
            return None

    def set_alias(self, name: str, alias: str, version: str | int) -> None:
        self.client.set_registered_model_alias(name, alias, str(version))

    def tag_model_version(self, name: str, version: str | int, tags: dict[str, Any]) -> None:
        """Tags on a registered version and on the logged model it was created from (the Models tab shows the
        logged model's, the registry the version's: the same lineage in both)."""
        tags = {k: str(v) for k, v in tags.items() if not SECRET_KEY.search(k)}
        for key, value in tags.items():
            self.client.set_model_version_tag(name, str(version), key, value)
        if (model_id := logged_model_id(self.client.get_model_version(name, str(version)))) is not None:
            self.client.set_logged_model_tags(model_id, tags)


def logged_model_id(version) -> str | None:
    """The logged model a registered version was created from (its source is `models:/<model_id>`), or None
    for a version registered from run artifacts. MLflow's SQL registry does not keep `version.model_id`."""
    source = version.source or ""
    if source.startswith("models:/m-") and "/" not in source[len("models:/"):]:
        return source[len("models:/"):]
    return version.model_id or None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v  # NaN is not logged


METRIC_NAME = re.compile(r"[A-Za-z0-9_/.\-]+")  # what MLflow, its filter strings and its UI take as it is


def _metric_name(name: str) -> str:
    """`name` when it is made of METRIC_NAME's characters; else each other character becomes `_`, and a warning
    says so (MLflow refuses some, and a name with a space needs quoting in a search): the stage should rename it."""
    if METRIC_NAME.fullmatch(name):
        return name
    logged = re.sub(r"[^A-Za-z0-9_/.\-]", "_", name)
    _warn_renamed(name, logged)
    return logged


@lru_cache(maxsize=256)
def _warn_renamed(name: str, logged: str) -> None:  # once per name
    log.warning("metric %r is logged as %r: name it with letters, digits and _ / . - only", name, logged)
