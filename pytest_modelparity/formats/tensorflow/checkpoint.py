"""Format ``checkpoint``: a TF1 checkpoint, i.e. a ``.meta`` MetaGraph plus its variables.

The graph is imported into its own ``tf.Graph`` with its own ``tf.compat.v1.Session``
(never global graph mode), and the variables are restored from the checkpoint prefix.
Accepts the ``.meta`` file, the prefix (``model.ckpt``), one of its ``.index``/``.data``
files, or a directory holding a ``checkpoint`` state file. Load only: there is no export.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...errors import ModelLoadError
from ...runtime.devices import require_tf_device
from ..common import first_line, quiet
from .graph import SessionModel, import_tf, new_session, resolve_tensors

NAME = "checkpoint"
EXPORT_REQUIRES: tuple[tuple[str, str], ...] = ()
_DATA_RE = re.compile(r"\.data-\d+-of-\d+$")


def _prefix_of(path: Path) -> Path | None:
    """The checkpoint prefix ``path`` names, or None when it names none."""
    text = str(path)
    if path.suffix == ".meta" or path.suffix == ".index":
        return Path(text[: -len(path.suffix)])
    if _DATA_RE.search(text):
        return Path(_DATA_RE.sub("", text))
    if path.is_dir():
        return _prefix_in_dir(path)
    if Path(text + ".meta").exists() or Path(text + ".index").exists():
        return path
    return None


def _prefix_in_dir(directory: Path) -> Path | None:
    state = directory / "checkpoint"
    if state.is_file():
        match = re.search(r'^model_checkpoint_path:\s*"(.*)"\s*$', state.read_text(errors="replace"), re.M)
        if match:
            candidate = Path(match.group(1))
            candidate = candidate if candidate.is_absolute() else directory / candidate
            if Path(str(candidate) + ".meta").exists():
                return candidate
            # The state file may hold a path from another machine: look beside it.
            local = directory / candidate.name
            if Path(str(local) + ".meta").exists():
                return local
    metas = sorted(directory.glob("*.meta"))
    if len(metas) == 1:
        return Path(str(metas[0])[: -len(".meta")])
    return None


def detect(path: Path) -> bool:
    if path.is_dir():
        return (path / "checkpoint").is_file() and any(path.glob("*.meta"))
    return path.suffix == ".meta" or Path(str(path) + ".meta").exists() or (
        path.suffix == ".index" and Path(str(path)[: -len(".index")] + ".meta").exists())


def _locate(path: Path) -> tuple[Path, Path]:
    """``(meta file, checkpoint prefix)`` for whatever path the user gave."""
    prefix = _prefix_of(path)
    if prefix is None:
        if not path.exists():
            raise ModelLoadError(path, NAME, "no such file, directory or checkpoint prefix "
                                 "(looked for it, and for <path>.meta and <path>.index)", "check the path")
        raise ModelLoadError(path, NAME, "not a TF1 checkpoint: no .meta graph and no checkpoint prefix found",
                             "pass the .meta file or the prefix (e.g. 'model.ckpt') of a TF1 Saver checkpoint")
    meta = Path(str(prefix) + ".meta")
    if not meta.is_file():
        raise ModelLoadError(path, NAME, f"no MetaGraph {meta.name!r} beside the checkpoint: a TF1 checkpoint "
                             "needs the .meta graph to be loaded without the Python code that built it",
                             "save with tf.compat.v1.train.Saver (write_meta_graph=True); a TF2 "
                             "tf.train.Checkpoint holds no graph: rebuild the model in code and pass it")
    if meta.stat().st_size == 0:
        # TensorFlow reads an empty MetaGraph as a graph with no ops ("0 candidate sinks").
        raise ModelLoadError(meta, NAME, "the .meta MetaGraph is empty (0 bytes): the checkpoint is truncated "
                             "or corrupt", "save the checkpoint again with tf.compat.v1.train.Saver")
    return meta, prefix


def load(source: Any, *, device: str = "cpu", inputs: Sequence[str] | None = None,
         outputs: Sequence[str] | None = None) -> SessionModel:
    path = Path(source)
    meta, prefix = _locate(path)
    dev = require_tf_device(device, format=NAME)
    tf = import_tf()
    graph = tf.Graph()
    try:
        with quiet(), graph.as_default(), tf.device(dev.tf_name):
            saver = tf.compat.v1.train.import_meta_graph(str(meta), clear_devices=True)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(meta, NAME, f"the .meta MetaGraph cannot be read ({first_line(exc)})",
                             "the file is truncated or corrupt: save the checkpoint again") from exc
    session = new_session(graph)
    if saver is not None:
        if not Path(str(prefix) + ".index").is_file():
            session.close()
            raise ModelLoadError(prefix, NAME, f"the graph has variables but there is no {prefix.name}.index",
                                 "pass the prefix the Saver wrote (the .index and .data-* files must be beside it)")
        try:
            with quiet(), graph.as_default():
                saver.restore(session, str(prefix))
        except Exception as exc:  # noqa: BLE001
            session.close()
            raise ModelLoadError(prefix, NAME, f"the variables cannot be restored ({first_line(exc)})",
                                 "the .index/.data-* files are truncated, corrupt, or from another graph") from exc
    try:
        in_tensors, out_tensors = resolve_tensors(graph, meta, NAME, inputs, outputs)
    except ModelLoadError:
        session.close()
        raise
    with graph.as_default():
        variables = tf.compat.v1.global_variables()

    def weights() -> dict[str, np.ndarray]:
        # What the session holds now (after restore), which is what predictions use.
        if not variables:
            return {}
        values = session.run(variables)
        return {v.op.name: np.asarray(x) for v, x in zip(variables, values)}

    return SessionModel(format=NAME, graph=graph, session=session, in_tensors=in_tensors,
                        out_tensors=out_tensors, device=device, source=meta, weights_fn=weights)
