"""``pytest --modelparity-fuzz=N``: drawn models through every selected converter
(``--modelparity-fuzz-minutes=M`` alone: as many as M minutes allow).

One item, ``modelparity-fuzz``: Hypothesis draws N models (``strategies.models``, seeded by
``--hypothesis-seed``, default 0), each is exported to each format and judged by the default
verdict (``fuzz/fuzzing.py``). Refusals are counted by cause, never failures. Each distinct
failure (format, outcome, known defect or cause) is shrunk by deleting steps, one export per
step and only for the failing format (Hypothesis' own shrinker would re-export every format per
step and stopped at local minima), then written as a standalone reproducer. The item fails
only on a failure no catalogue entry knows; the end-of-run summary lists everything.

Under pytest-xdist (``-n N``, ``--tx``) the run is one item per worker, ``modelparity-fuzz[gwI]``,
each drawing its own stream (the seed split by worker: stream 0 is the plain run's), all
stopping at one deadline the controller set when it started the workers. A failure is shrunk
on the worker that found it; its reproducer folder travels to the controller with the worker's
tallies (no shared disk is assumed), and the controller writes the one summary and JSON section.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ..fuzz.reproducer import shrink_failure, write_reproducer
from .session import ParitySession, get_state

FUZZ_NODEID = "modelparity-fuzz"
DEFAULT_FORMATS = ("tflite", "onnx", "tfjs")
MAX_LAYERS = 6
# --modelparity-fuzz-minutes without --modelparity-fuzz: as many models as the minutes allow
UNTIL_THE_TIME_IS_SPENT = 10**9
# A fuzz run says where it stands this often (models drawn, per-format tallies, failures, time).
PROGRESS_EVERY_S = 30.0
# pytest-xdist: the controller's deadline (epoch seconds) in each worker's workerinput, and the
# key of a worker's results in its workeroutput
DEADLINE_KEY = "modelparity_fuzz_deadline"
WORKER_RESULTS_KEY = "modelparity_fuzz"


@dataclass
class FuzzResults:
    models: int = 0
    seconds: float = 0.0
    counts: dict[tuple[str, str], int] = field(default_factory=dict)    # (format, status) -> n
    refusals: dict[tuple[str, str], int] = field(default_factory=dict)  # (format, cause) -> n
    failures: dict[tuple[str, str, str], Any] = field(default_factory=dict)  # key -> (drawn, outcome)
    written: dict[tuple[str, str, str], Path] = field(default_factory=dict)
    shrunk: dict[tuple[str, str, str], tuple[int, int, float]] = field(default_factory=dict)
    stopped_by_budget: bool = False
    conditions: dict[str, Any] | None = None  # what the models were checked under (fuzz/conditions.py)
    workers: dict[str, int] = field(default_factory=dict)  # xdist worker id -> models it drew (controller)

    def shrunk_of(self, key: tuple[str, str, str]) -> tuple[int, int, float]:
        """(layers drawn, layers after shrinking, checks): a worker's failure arrives shrunk,
        without its drawn model."""
        if key in self.shrunk:
            return self.shrunk[key]
        drawn = self.failures[key][0]
        return (len(drawn.layers), len(drawn.layers), 0)


RESULTS_KEY = pytest.StashKey[FuzzResults]()


class FuzzRun(pytest.Item):
    def __init__(self, *, formats: tuple[str, ...], stream: int = 0, streams: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.formats = formats
        self.stream = stream  # which of the run's draw streams (one per xdist worker)
        self.streams = streams

    def runtest(self) -> None:
        from ..fuzz.fuzz_worker import FuzzWorker

        options = get_state(self.config).options
        results = self.config.stash.setdefault(RESULTS_KEY, FuzzResults())
        start = time.monotonic()
        budget = None if options.fuzz_minutes is None else options.fuzz_minutes * 60.0
        given = getattr(self.config, "workerinput", {}).get(DEADLINE_KEY)
        if budget is not None and given is not None:  # the whole run's budget, from when the controller began
            budget = max(0.0, float(given) - time.time())
        root = Path(options.cache_dir)
        root.mkdir(parents=True, exist_ok=True)
        with FuzzWorker(root / "logs" / "fuzz-child.log") as worker:
            self._run(worker, options, results, start, budget, root)

    def _run(self, worker: Any, options: Any, results: FuzzResults, start: float, budget: float | None,
             root: Path) -> None:
        from ..fuzz.model_draw import for_each_drawn
        from ..runtime import progress

        said = [start]

        def visit(drawn: Any) -> None:
            results.models += 1
            outcomes = worker.check(drawn, self.formats, workdir=root)
            results.conditions = worker.conditions or results.conditions
            for outcome in outcomes:
                fmt_status = (outcome.format, outcome.status)
                results.counts[fmt_status] = results.counts.get(fmt_status, 0) + 1
                if outcome.status == "refused" and not outcome.known:
                    key = (outcome.format, outcome.cause)
                    results.refusals[key] = results.refusals.get(key, 0) + 1
                elif outcome.status != "pass" and outcome.key not in results.failures:
                    results.failures[outcome.key] = (drawn, outcome)
            now = time.monotonic()
            if now - said[0] >= PROGRESS_EVERY_S:
                said[0] = now
                progress.say(tally_line(results, now - start))

        share = _share(int(options.fuzz or UNTIL_THE_TIME_IS_SPENT), self.stream, self.streams)
        if share:  # more workers than --modelparity-fuzz models: this one draws none
            results.stopped_by_budget = for_each_drawn(
                visit, seed=stream_seed(int(self.config.getoption("hypothesis_seed", None) or 0), self.stream),
                max_examples=share, deadline=None if budget is None else start + budget,
                max_layers=MAX_LAYERS) or results.stopped_by_budget
        results.seconds = time.monotonic() - start
        if results.conditions is None:  # no model reached a child: this process's, which the child inherits
            from ..fuzz.conditions import conditions_here

            results.conditions = conditions_here()
        out_dir = fuzz_folder(options)
        for key, (drawn, outcome) in list(results.failures.items()):
            if key in results.written:  # shrunk by an earlier stream of this worker
                continue
            minimal, outcome, steps = shrink_failure(worker, drawn, outcome, root)
            results.failures[key] = (minimal, outcome)
            results.shrunk[key] = (len(drawn.layers), len(minimal.layers), steps)
            results.written[key] = write_reproducer(out_dir, minimal, outcome, results.conditions)
        new = [k for k, (_, o) in results.failures.items() if not o.known]
        if new:
            raise FuzzFailure("\n".join(
                f"{o.format}: {o.status} ({o.cause})"
                + (f", resembles {o.resembles}" + (f" ({o.note})" if o.note else "") if o.resembles else "")
                + f", shrunk to {len(d.layers)} layer(s): {d!r}\n"
                f"  reproducer: {results.written[k]}\n" + _indent(o.text, 12)
                for k, (d, o) in results.failures.items() if k in new))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, FuzzFailure):
            return f"modelparity fuzz found new converter failures:\n{excinfo.value}"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"modelparity fuzz [{','.join(self.formats)}]"


class FuzzFailure(AssertionError):
    pass


def _share(models: int, stream: int, streams: int) -> int:
    """``--modelparity-fuzz=N`` over several streams: N in all, the first N % streams one more."""
    return models // streams + (1 if stream < models % streams else 0)


def stream_seed(seed: int, stream: int) -> int:
    """Stream 0 draws what a run without xdist draws; each other stream a seed of its own."""
    if stream == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"modelparity-fuzz/{seed}/{stream}".encode()).digest()[:4], "little")


def _indent(text: str, lines: int) -> str:
    kept = text.strip().splitlines()[:lines]
    return "".join(f"    {line}\n" for line in kept)


def fuzz_folder(options: Any) -> Path:
    """Beside the JSON report when there is one (``--modelparity-report``), else in the cache."""
    base = Path(options.report).parent if options.report else Path(options.cache_dir)
    return base / "modelparity-fuzz"


def _tallies(results: FuzzResults, fmt: str) -> str:
    return ", ".join(f"{results.counts[(fmt, s)]} {s}" for s in ("pass", "fail", "error", "refused")
                     if results.counts.get((fmt, s)))


def tally_line(results: FuzzResults, elapsed: float) -> str:
    """Where a fuzz run stands, said every ``PROGRESS_EVERY_S``: models drawn, each format's
    tallies, distinct failures (new ones: outside the catalogue) and the time spent."""
    formats = "; ".join(f"{fmt} {_tallies(results, fmt)}" for fmt in sorted({f for f, _ in results.counts}))
    new = sum(1 for _, o in results.failures.values() if not o.known)
    return (f"modelparity fuzz, so far: {results.models} model(s) in {elapsed:.0f} s; {formats or 'nothing judged yet'}; "
            f"{len(results.failures)} distinct failure(s), {new} new")


def report_section(config: pytest.Config) -> dict | None:
    """The fuzz run in the JSON report (``fuzz``, docs/report-schema.md), None without one."""
    results = config.stash.get(RESULTS_KEY, None)
    if results is None:
        return None
    formats = sorted({f for f, _ in results.counts})
    failures = []
    for key, (drawn, outcome) in results.failures.items():
        before, after, checks = results.shrunk_of(key)
        written = results.written.get(key)
        failures.append({"format": outcome.format, "status": outcome.status, "cause": outcome.cause,
                         "known": outcome.known, "new": not outcome.known,
                         "resembles": getattr(outcome, "resembles", None), "note": getattr(outcome, "note", None),
                         "layers_drawn": before,
                         "layers_shrunk": after, "shrink_checks": checks,
                         "reproducer": str(written) if written is not None else None})
    return {"models": results.models, "seconds": round(results.seconds, 1),
            "stopped_by_budget": results.stopped_by_budget,
            "workers": dict(results.workers),
            "conditions": results.conditions,
            "outcomes": {fmt: {s: results.counts.get((fmt, s), 0) for s in ("pass", "fail", "error", "refused")}
                         for fmt in formats},
            "refusals": [{"format": fmt, "cause": cause, "models": n}
                         for (fmt, cause), n in sorted(results.refusals.items(), key=lambda kv: -kv[1])],
            "failures": failures}


def summary_lines(config: pytest.Config) -> list[str]:
    """The end-of-run fuzz summary (empty when no fuzz run happened)."""
    results = config.stash.get(RESULTS_KEY, None)
    if results is None:
        return []
    lines = [f"modelparity fuzz: {results.models} model(s) in {results.seconds:.0f} s"
             + (" (stopped by --modelparity-fuzz-minutes)" if results.stopped_by_budget else "")
             + (f" over {len(results.workers)} xdist workers (" + ", ".join(f"{w} {n}" for w, n in sorted(results.workers.items())) + ")"
                if results.workers else "")]
    if results.conditions:
        from ..fuzz.conditions import describe

        lines.append(f"  conditions: {describe(results.conditions)}")
    for fmt in sorted({f for f, _ in results.counts}):
        lines.append(f"  {fmt}: {_tallies(results, fmt)}")
    for (fmt, cause), n in sorted(results.refusals.items(), key=lambda kv: -kv[1]):
        lines.append(f"  refused by {fmt} ({n}x): {cause}")
    for key, (drawn, outcome) in results.failures.items():
        label = f"known: {outcome.known}" if outcome.known else (
            f"NEW, resembles {outcome.resembles}" if getattr(outcome, "resembles", None) else "NEW")
        if getattr(outcome, "note", None):
            label += f"; {outcome.note}"
        before, after, calls = results.shrunk_of(key)
        lines.append(f"  {outcome.format} {outcome.status} [{label}] shrunk {before} -> {after} layer(s) in {calls} "
                     f"check(s); reproducer: {results.written.get(key, '-')}")
    return lines


def fuzz_items(session: pytest.Session, state: ParitySession) -> list[FuzzRun]:
    """The fuzz item over the selected formats (default: tflite, onnx, tfjs where installed)."""
    from ..formats import available_formats

    if state.options.formats_explicit:
        formats = tuple(state.options.formats)
    else:
        formats = tuple(f for f in DEFAULT_FORMATS if f in available_formats())
    workers = int(getattr(session.config, "workerinput", {}).get("workercount", 1))
    if workers <= 1:
        return [FuzzRun.from_parent(session, name=FUZZ_NODEID, nodeid=FUZZ_NODEID, formats=formats)]
    # xdist: every worker collects the same items; the scheduler hands one to each (fewer items
    # than twice the workers go round-robin), and each item draws its own stream
    return [FuzzRun.from_parent(session, name=f"{FUZZ_NODEID}[gw{i}]", nodeid=f"{FUZZ_NODEID}[gw{i}]",
                                formats=formats, stream=i, streams=workers) for i in range(workers)]


# -- pytest-xdist: the controller sets the deadline and gathers the workers' results ------------

def configure_node(node: Any, options: Any, started: float) -> None:
    """At the controller, before a worker starts: the run's deadline, so that the budget holds
    for the whole run however long the workers take to start."""
    if options.fuzz_minutes is not None:
        node.workerinput[DEADLINE_KEY] = started + options.fuzz_minutes * 60.0


def worker_payload(config: pytest.Config) -> dict | None:
    """This worker's results for the controller (None when it ran no fuzz item)."""
    results = config.stash.get(RESULTS_KEY, None)
    return None if results is None else payload_of(results)


def merge_worker(config: pytest.Config, worker: str, output: dict) -> None:
    """At the controller: one worker's results (in its ``workeroutput``, when it fuzzed) into the
    run's, reproducers into its fuzz folder."""
    payload = output.get(WORKER_RESULTS_KEY)
    if not payload:
        return
    merge_payload(config.stash.setdefault(RESULTS_KEY, FuzzResults()), worker, payload,
                  fuzz_folder(get_state(config).options))


def payload_of(results: FuzzResults) -> dict:
    """A worker's results as plain data (execnet carries only builtins): tallies, each failure's
    outcome and shrink figures, and its reproducer folder's files."""
    failures = []
    for key, (_, outcome) in results.failures.items():
        folder = results.written.get(key)
        files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()} if folder else {}
        failures.append({"outcome": dataclasses.asdict(outcome), "shrunk": list(results.shrunk_of(key)),
                         "folder": folder.name if folder else None, "files": files})
    return {"models": results.models, "seconds": results.seconds, "stopped_by_budget": results.stopped_by_budget,
            "conditions": results.conditions,
            "counts": [[f, s, n] for (f, s), n in results.counts.items()],
            "refusals": [[f, c, n] for (f, c), n in results.refusals.items()], "failures": failures}


def merge_payload(results: FuzzResults, worker: str, payload: dict, out_dir: Path) -> None:
    """Add one worker's ``payload_of`` to ``results``, writing each reproducer into ``out_dir``
    (the controller's own fuzz folder; a failure two workers found is kept once)."""
    from ..fuzz.fuzzing import Outcome

    results.models += int(payload["models"])
    results.workers[worker] = results.workers.get(worker, 0) + int(payload["models"])
    results.seconds = max(results.seconds, float(payload["seconds"]))
    results.stopped_by_budget = results.stopped_by_budget or bool(payload["stopped_by_budget"])
    results.conditions = results.conditions or payload.get("conditions")
    for f, s, n in payload["counts"]:
        results.counts[(f, s)] = results.counts.get((f, s), 0) + int(n)
    for f, c, n in payload["refusals"]:
        results.refusals[(f, c)] = results.refusals.get((f, c), 0) + int(n)
    for failure in payload["failures"]:
        outcome = Outcome(**failure["outcome"])
        if outcome.key in results.failures:
            continue
        results.failures[outcome.key] = (None, outcome)
        before, after, checks = failure["shrunk"]
        results.shrunk[outcome.key] = (int(before), int(after), checks)
        if failure["folder"]:
            folder = out_dir / failure["folder"]
            folder.mkdir(parents=True, exist_ok=True)
            for name, data in failure["files"].items():
                (folder / Path(name).name).write_bytes(data)
            results.written[outcome.key] = folder
