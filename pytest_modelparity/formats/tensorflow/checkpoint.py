"""Format ``checkpoint``: a TF1 checkpoint, i.e. a ``.meta`` MetaGraph plus its variables.

The graph is imported into its own ``tf.Graph`` with its own ``tf.compat.v1.Session``
(never global graph mode), and the variables are restored from the checkpoint prefix.
Accepts the ``.meta`` file, the prefix (``model.ckpt``, or ``<dir>/`` when the Saver was given
a directory), one of its ``.index``/``.data`` files, or a directory holding one checkpoint (by
its ``checkpoint`` state file, whose path from another machine is looked up beside it, or by its
only ``.meta``). Load only: there is no export.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ...errors import ModelLoadError
from ...runtime.devices import require_tf_device
from ..common import first_line, quiet, record_route
from .graph import SessionModel, import_tf, new_session, resolve_tensors
from .metagraph_import import import_meta_graph
from .switches import fold_feeds
from .trust import refuse_untrusted

NAME = "checkpoint"
EXPORT_REQUIRES: tuple[tuple[str, str], ...] = ()


# The files a Saver writes for a prefix P: P.meta, P.index, P.data-00000-of-00001 (and more
# shards). The prefix is a string, not a Path: a checkpoint saved under "<dir>/" has the files
# "<dir>/.meta", "<dir>/.index", ... (an empty basename) and pathlib drops the trailing slash.
_SUFFIX_RE = re.compile(r"(\.meta|\.index|\.data-\d+-of-\d+)$")


def _meta(prefix: str) -> Path:
    return Path(prefix + ".meta")


def _has_files(prefix: str) -> bool:
    return _meta(prefix).exists() or Path(prefix + ".index").exists()


def _dir_prefix(directory: Path) -> str:
    """The prefix of the files ``<dir>/.meta`` etc.: the directory and a separator."""
    return os.path.join(str(directory), "")


def _state_prefix(directory: Path) -> str | None:
    """The prefix the ``checkpoint`` state file names, found beside the state file when it
    names a path on another machine (the usual case for a checkpoint someone shipped)."""
    state = directory / "checkpoint"
    if not state.is_file():
        return None
    match = re.search(r'^model_checkpoint_path:\s*"(.*)"\s*$', state.read_text(errors="replace"), re.M)
    if not match:
        return None
    named = match.group(1)
    if not os.path.isabs(named):
        candidates = [os.path.join(str(directory), named)]
    else:
        # The files beside the state file first: the directory given is the one meant, even
        # where the author's path also exists here (a copied directory).
        candidates = []
        if named.endswith(("/", "\\")):
            candidates.append(_dir_prefix(directory))  # saved under "<dir>/": the files are here
        base = os.path.basename(named.replace("\\", "/").rstrip("/"))
        if base:
            candidates.append(os.path.join(str(directory), base))
        candidates.append(named)
    return next((c for c in candidates if _meta(c).is_file()), None)


def _metas_in(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.endswith(".meta") and p.is_file())


def _prefix_in_dir(directory: Path) -> str | None:
    """The one checkpoint a directory holds (by its state file, else its only ``.meta``)."""
    found = _state_prefix(directory)
    if found is not None:
        return found
    metas = _metas_in(directory)
    if len(metas) == 1:
        return str(metas[0])[: -len(".meta")]
    return None


def _prefix_of(text: str) -> str | None:
    """The checkpoint prefix the path ``text`` (as the user wrote it) names, or None."""
    path = Path(text)
    if path.is_dir():
        return _prefix_in_dir(path)
    if _SUFFIX_RE.search(path.name):
        # "<dir>/.meta" too: its name is all suffix (pathlib's .suffix is empty there).
        return _SUFFIX_RE.sub("", text)
    if _has_files(text):
        return text
    return None


def detect(path: Path) -> bool:
    if path.is_dir():
        return _prefix_in_dir(path) is not None or ((path / "checkpoint").is_file() and bool(_metas_in(path)))
    if path.name.endswith(".meta"):
        return True
    if _SUFFIX_RE.search(path.name):
        return _meta(_SUFFIX_RE.sub("", str(path))).exists()
    return _meta(str(path)).exists()


def _listing(directory: Path, limit: int = 8) -> str:
    names = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
    if not names:
        return "it is empty"
    shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
    return f"it holds {shown}"


def _not_found(text: str) -> ModelLoadError:
    """Why no checkpoint prefix is found at ``text``, in words that say what is there."""
    path = Path(text)
    if not path.exists():
        return ModelLoadError(path, NAME, "no such file, directory or checkpoint prefix "
                              "(looked for it, and for <path>.meta and <path>.index)", "check the path")
    if path.is_dir():
        metas = _metas_in(path)
        if len(metas) > 1:
            return ModelLoadError(path, NAME, f"the directory holds {len(metas)} checkpoints "
                                  f"({', '.join(m.name for m in metas)}) and no checkpoint state file naming "
                                  "one of them", "pass the .meta file of the one to load")
        return ModelLoadError(path, NAME, f"the directory holds no .meta MetaGraph ({_listing(path)})",
                              "pass the directory a tf.compat.v1.train.Saver wrote (its .meta, .index and "
                              ".data-* files), or the .meta file itself")
    return ModelLoadError(path, NAME, f"not a TF1 checkpoint: a file named {path.name!r} with no "
                          f"{path.name}.meta or {path.name}.index beside it",
                          "pass the .meta file, the prefix (e.g. 'model.ckpt') or the directory of a TF1 "
                          "Saver checkpoint")


def _locate(text: str) -> tuple[Path, str]:
    """``(meta file, checkpoint prefix)`` for whatever path the user gave."""
    prefix = _prefix_of(text)
    if prefix is None:
        raise _not_found(text)
    meta = _meta(prefix)
    if not meta.is_file():
        folder = Path(prefix).parent if not prefix.endswith(("/", os.sep)) else Path(prefix)
        found = sorted(p.name for p in folder.iterdir() if p.name.startswith(os.path.basename(prefix))
                       and _SUFFIX_RE.search(p.name)) if folder.is_dir() else []
        what = f"found {', '.join(found)} but" if found else "found"
        raise ModelLoadError(Path(text), NAME, f"{what} no MetaGraph {meta.name!r} beside them in "
                             f"{folder}: a TF1 checkpoint needs the .meta graph to be loaded without the Python "
                             "code that built it",
                             "save with tf.compat.v1.train.Saver (write_meta_graph=True); a TF2 "
                             "tf.train.Checkpoint holds no graph: rebuild the model in code and pass it")
    if meta.stat().st_size == 0:
        # TensorFlow reads an empty MetaGraph as a graph with no ops ("0 candidate sinks").
        raise ModelLoadError(meta, NAME, "the .meta MetaGraph is empty (0 bytes): the checkpoint is truncated "
                             "or corrupt", "save the checkpoint again with tf.compat.v1.train.Saver")
    return meta, prefix


def load(source: Any, *, device: str = "cpu", inputs: Sequence[str] | None = None,
         outputs: Sequence[str] | None = None, feeds: Mapping[str, Any] | None = None,
         trusted: bool | None = None) -> SessionModel:
    """``feeds`` sets graph switches (``{"is_training": False}``), folded in as constants."""
    text = os.fspath(source)
    meta, prefix = _locate(text)
    refuse_untrusted(meta, NAME, trusted)  # before TensorFlow imports it (docs/security.md)
    dev = require_tf_device(device, format=NAME)
    tf = import_tf()
    graph, saver, route = import_meta_graph(tf, meta, dev.tf_name, NAME,
                                            rewrite=lambda graph_def: fold_feeds(graph_def, feeds, meta, NAME))
    if route is not None:
        record_route(meta, NAME, route, action="load")
    session = new_session(graph)
    if saver is not None:
        if not Path(prefix + ".index").is_file():
            session.close()
            raise ModelLoadError(Path(prefix), NAME, f"the graph has variables but there is no "
                                 f"{os.path.basename(prefix)}.index beside {meta.name}",
                                 "pass the prefix the Saver wrote (the .index and .data-* files must be beside it)")
        try:
            with quiet(), graph.as_default():
                saver.restore(session, prefix)
        except Exception as exc:  # noqa: BLE001
            session.close()
            raise ModelLoadError(Path(prefix), NAME, f"the variables cannot be restored ({first_line(exc)})",
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

    model = SessionModel(format=NAME, graph=graph, session=session, in_tensors=in_tensors,
                         out_tensors=out_tensors, device=device, source=meta, weights_fn=weights)
    model.load_route = route  # how an old MetaGraph had to be read (None: as it is)
    return model
