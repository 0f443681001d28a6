"""The tfjs format where web users run it: a page in a real headless Chromium.

``load_model(path, "tfjs", backend="webgl" | "webgl-f16" | "webgpu")`` (and the plugin's
formats ``tfjs:webgl``, ``tfjs:webgl-f16``, ``tfjs:webgpu``) run the same ``model.json`` as the
Node.js ``tfjs`` format, in a page of the session's one Chromium
(``runtime/browser_process.py``): WebGL with float32 textures, WebGL with float16 textures
forced (``WEBGL_FORCE_F16_TEXTURES``: what phones and tablets without float32 render targets
store activations in), or WebGPU where Chromium offers an adapter. The model is a
``TFJSModel`` whose process is the page, so predicts, intermediates, the int32 range check,
the op/backend error words and the restart after a death are the Node format's own.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ...errors import DeviceUnavailable, ModelLoadError, RuntimeMissing
from .load import NAME, TFJSModel, check_input_dtypes, model_json_path, read_model_json, run_error

# WebGL shaders address tensors of rank <= 6: a kernel given a rank-7 tensor says
# "Transpose for rank 7 is not yet supported" (or "7-D output sampling"); tfjs's cpu backend has no limit.
_RANK_LIMIT = re.compile(r"(?:Packed )?(\w+) for rank[- ](\d+)|(\w+) of rank-(\d+) tensor|(\d+)-D (?:input|output) sampling")

# The plugin's runtime variants tfjs:webgl, tfjs:webgl-f16, tfjs:webgpu (plugin/options.py
# FORMAT_VARIANTS repeats them: importing this module at start-up would import numpy).
BROWSER_BACKENDS = ("webgl", "webgl-f16", "webgpu")
WEBGPU_FIX = ("to test WebGPU, run on a machine whose Chromium offers WebGPU (a GPU with Vulkan drivers; pass "
              "MODELPARITY_CHROMIUM_FLAGS='--enable-unsafe-webgpu' where Chromium needs it), or test tfjs:webgl")


class BrowserTFJSModel(TFJSModel):
    """A tfjs graph model served by a page of the session's headless Chromium."""

    @property
    def browser(self) -> dict[str, Any]:
        """What ran it: ``chromium`` (version), ``renderer`` (WebGL's), ``textures``, ``backend``."""
        meta = self.process.meta
        return {"format": self.format_variant, "chromium": self.process.host.meta.get("chromium"),
                "renderer": meta.get("renderer"), "textures": meta.get("textures"),
                "webgl_version": meta.get("webgl_version"), "tfjs_version": meta.get("tfjs_version")}

    def _predict(self, feeds: dict[str, Any]) -> dict[str, Any]:
        from ...runtime.tfjs_process import RunnerError

        try:
            result = self._served(lambda page: page.predict(feeds))
        except RunnerError as exc:
            raise browser_error(Path(str(self.source)), self.backend, str(exc), self._spec) from exc
        return {s.name: result[s.name] for s in self.outputs}

    def _serving(self) -> Any:
        page = super()._serving()
        from ...runtime.browser_process import record_run

        record_run(self.browser)
        return page


def browser_error(path: Path, backend: str, message: str, spec: dict[str, Any], action: str = "run") -> ModelLoadError:
    """The typed error of a model the page cannot run: the op, the backend and the fix, naming
    the graph nodes of that op; otherwise the Node format's classification (kernels, ops)."""
    found = _RANK_LIMIT.search(message)
    if found is None:
        return run_error(path, backend, message, action=action)
    op = found.group(1) or found.group(3)
    rank = found.group(2) or found.group(4) or found.group(5)
    nodes = [n.get("name", "?") for n in (spec.get("modelTopology") or {}).get("node", [])
             if op and str(n.get("op", "")).lower() == op.lower()]
    where = f" (node{'s' if len(nodes) > 1 else ''} {', '.join(nodes[:3])}{' ...' if len(nodes) > 3 else ''})" if nodes else ""
    what = f"op {op[0].upper() + op[1:]!r}{where}" if op else "an op"
    detail = message.split("failed: ", 1)[-1].splitlines()[0]
    return ModelLoadError(path, NAME, f"tfjs's {backend} backend cannot run {what} on a rank-{rank} tensor: WebGL "
                          f"kernels handle rank 6 at most ({detail})",
                          "reshape to rank <= 6 around that op (e.g. merge two axes before the Permute/transpose), "
                          "or test this model on tfjs in Node.js (backend 'cpu' or 'wasm', no rank limit)", action=action)


def load(source: Any, *, device: str = "cpu", backend: str = "webgl", timeout_s: float | None = 600.0,
         **options: Any) -> BrowserTFJSModel:
    """Load a graph model into a new page of the session's Chromium (started on first use).

    Without Chromium this raises ``RuntimeMissing`` saying how to get one, without a WebGPU
    adapter (``"webgpu"``) ``DeviceUnavailable``; the plugin skips on both (fails under
    ``--modelparity-strict``). ``timeout_s`` bounds the browser's start, each load and each
    predict, as for the Node runner.
    """
    if options:
        raise TypeError(f"unexpected option(s) for format 'tfjs' in a browser: {', '.join(sorted(options))}; "
                        f"it takes backend={'|'.join(BROWSER_BACKENDS)} and timeout_s")
    if backend not in BROWSER_BACKENDS:
        raise ValueError(f"unknown browser backend {backend!r}; use one of {', '.join(BROWSER_BACKENDS)}")
    from ...runtime.devices import require_cpu_only

    require_cpu_only(device, NAME, "the browser backends run in headless Chromium on SwiftShader, the CPU",
                     "Use device='cpu'.")
    from ...runtime import tfjs_runner
    from ...runtime.browser_process import CHROMIUM_HINT, chromium_executable, shared_browser
    from ...runtime.tfjs_process import NodeProcessDied, RunnerError, retry_unanswered

    path = model_json_path(source)
    spec = read_model_json(path)
    check_input_dtypes(path, spec)
    chromium = chromium_executable()  # RuntimeMissing before npm or Node are touched
    node = tfjs_runner.node_executable()
    node_modules = tfjs_runner.ensure_node_modules()
    files = [rel for group in spec.get("weightsManifest") or [] for rel in group.get("paths", [])]

    def start(which: str) -> Any:
        description = f"tfjs model {str(path)!r} ({which} backend, Chromium)"
        def open_page() -> Any:  # a browser found dead (the shared one) is started again
            host = shared_browser(node=node, node_modules=node_modules, timeout_s=timeout_s)
            return host.open_page(path, files, "webgpu" if which == "webgpu" else "webgl", which == "webgl-f16",
                                  description)

        try:  # a death before the page's answer (a kill, the OOM killer) is retried once, as for Node
            return retry_unanswered(open_page, description)
        except RunnerError as exc:
            text = str(exc)
            if "no WebGPU adapter" in text:
                raise DeviceUnavailable(f"{description}: no WebGPU adapter in Chromium here "
                                        f"({text.split('no WebGPU adapter: ')[-1]}); {WEBGPU_FIX}") from exc
            if "browser bundle" in text:
                raise RuntimeMissing(f"tfjs's browser bundles in {node_modules} ({text})",
                                     f"remove that directory and run `{tfjs_runner.INSTALL_COMMAND}`") from exc
            if "the file server refused " in text:
                refused = text.split("the file server refused ", 1)[1]
                raise ModelLoadError(path, NAME, f"the browser's file server refused {refused}: it serves a "
                                     "weight file only if, when the page asks for it, it is the regular file the "
                                     "manifest names inside the model's folder",
                                     "replace the link with the file itself (a copy inside the model's folder), "
                                     "or load the model again from where the files really are", action="load") from exc
            if "cannot start the browser" in text:
                raise RuntimeMissing(f"a working Chromium ({chromium}: {text})", CHROMIUM_HINT) from exc
            raise browser_error(path, which, text, spec, action="load") from exc
        except NodeProcessDied as exc:
            raise ModelLoadError(path, NAME, str(exc), "check that the browser starts: "
                                 f"{chromium} --headless=new --no-sandbox --version") from exc

    model = BrowserTFJSModel(Path(path), spec, start(backend), backend=backend, device="cpu", requested=backend,
                             start=start)
    from ...runtime.browser_process import record_run

    record_run(model.browser)
    return model
