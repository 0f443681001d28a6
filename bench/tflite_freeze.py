"""Bench: the tflite export's converter input, the serving function with its variables frozen
(an empty holder to save) against the function with its variable holder (the converter saves
every variable as a SavedModel first, tracing a save and a restore function over them).
Tried in the fifth round of issue 49 and not taken: MobileNetV2 converted 2.2-2.5x faster, but
InceptionV3 at 75 px 0.82-0.91x (its freeze costs more than the save it spares); figures in
docs/performance.md.

For each net and variant both ways run in one process, alternating, ``--repeats`` times; the
figure is the median CPU seconds (``time.process_time``) of ``TFLiteConverter.convert`` plus the
freeze, and both files are run in LiteRT on the same batch: outputs bitwise equal or not, and
the signature (input and output names) the same or not.

    .venv/bin/python bench/tflite_freeze.py [--repeats 3] [--nets mobilenetv2,inceptionv3,...] [--variants int8,...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

NETS = {
    "mobilenetv2": lambda: __import__("models").keras_app("mobilenetv2", 48),
    "inceptionv3": lambda: __import__("models").keras_app("inceptionv3", 75),
    "mobilenetv3small": lambda: __import__("families").mobilenet_v3_small(),
    "gelu_encoder": lambda: __import__("families").gelu_encoder(),
    "gpt_decoder": lambda: __import__("families").gpt_decoder(),
    "two_input": lambda: __import__("families").two_input(),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nets", default=",".join(NETS))
    parser.add_argument("--variants", default="float32,float16,dynamic_range,int8")
    args = parser.parse_args(argv)

    import numpy as np
    import tensorflow as tf
    from ai_edge_litert.interpreter import Interpreter
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    from pytest_modelparity.formats.tensorflow.serving import converter_holder, serving_function

    def frozen_function(serving, concrete):
        """The serving function with its variables frozen (functional control flow kept,
        outputs keeping their names), and an empty holder: nothing left for the save."""
        frozen = convert_variables_to_constants_v2(concrete, lower_control_flow=False)

        def serve(*xs):
            return tf.nest.pack_sequence_as(concrete.structured_outputs, tf.nest.flatten(frozen(*xs)))

        return tf.function(serve, input_signature=serving.specs, autograph=False).get_concrete_function(), tf.Module()

    def convert(fn, holder, variant, batch):
        made = tf.lite.TFLiteConverter.from_concrete_functions([fn], holder)
        if variant != "float32":
            made.optimizations = [tf.lite.Optimize.DEFAULT]
        if variant == "float16":
            made.target_spec.supported_types = [tf.float16]
        if variant == "int8":  # calibrated on the batch's rows, one at a time, float inputs and outputs
            # a dict batch by input name (the signature's), as LiteRT's calibrator feeds a signature
            named = batch if isinstance(batch, dict) else None
            rows = list(named.values()) if named else [batch]
            made.representative_dataset = lambda: (
                {k: np.asarray(v[i:i + 1]) for k, v in named.items()} if named
                else [np.asarray(r[i:i + 1]) for r in rows] for i in range(len(rows[0])))
        return made.convert()

    def run(content, batch):
        runner = Interpreter(model_content=content).get_signature_runner()
        names = list(runner.get_input_details())
        feeds = batch if isinstance(batch, dict) else dict(zip(names, batch if isinstance(batch, (list, tuple))
                                                                 else [batch]))
        return runner(**{k: np.asarray(v) for k, v in feeds.items()})

    print(f"{'net':18s} {'variant':14s} {'holder CPU-s':>12s} {'frozen CPU-s':>12s} {'ratio':>6s}  outputs  signature")
    for name in args.nets.split(","):
        model, batch = NETS[name]()
        serving = serving_function(model)
        concrete = serving.function.get_concrete_function()
        for variant in args.variants.split(","):
            spent: dict[str, list[float]] = {"holder": [], "frozen": []}
            files: dict[str, bytes] = {}
            for _ in range(args.repeats):
                start = time.process_time()
                files["holder"] = convert(concrete, converter_holder(serving, concrete), variant, batch)
                spent["holder"].append(time.process_time() - start)
                start = time.process_time()
                files["frozen"] = convert(*frozen_function(serving, concrete), variant, batch)
                spent["frozen"].append(time.process_time() - start)
            a, b = (run(files[k], batch) for k in ("holder", "frozen"))
            same = sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
            sig = (Interpreter(model_content=files["holder"]).get_signature_list()
                   == Interpreter(model_content=files["frozen"]).get_signature_list())
            h, f = statistics.median(spent["holder"]), statistics.median(spent["frozen"])
            print(f"{name:18s} {variant:14s} {h:12.2f} {f:12.2f} {h / f:6.2f}  {'equal' if same else 'DIFFER':7s}  "
                  f"{'same' if sig else 'DIFFERS'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
