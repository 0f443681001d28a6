"""Does the tflite-l2-normalization-eps defect depend on LiteRT's XNNPACK delegate? (issue 46)

    python bench/xnnpack_l2norm.py

The catalogue entry's model, exported by the plugin once, run by LiteRT with its default
delegates (XNNPACK, as the plugin's loader runs a file) and without them
(BUILTIN_WITHOUT_DEFAULT_DELEGATES); prints the ops each interpreter ran and the error against Keras.
"""

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from pytest_modelparity.fuzz.known_defects import by_name
from pytest_modelparity import export_model
from pytest_modelparity.formats.tflite.load import new_interpreter
e = by_name("tflite-l2-normalization-eps")
m = e.model.build(); x = e.model.batch()[0]
ref = np.asarray(m(x))
with tempfile.TemporaryDirectory() as d:
    p = export_model(m, "tflite", os.path.join(d, "m.tflite"))
    content = open(p, "rb").read()
for nd in (False, True):
    it = new_interpreter(content, no_delegates=nd)
    inp = it.get_input_details()[0]; out = it.get_output_details()[0]
    it.resize_tensor_input(inp["index"], x.shape); it.allocate_tensors()
    it.set_tensor(inp["index"], x); it.invoke()
    got = it.get_tensor(out["index"])
    ops = sorted({o["op_name"] for o in it._get_ops_details()})
    print("xnnpack" if not nd else "no delegates", ops, "max abs err", float(np.max(np.abs(got - ref))), "max |ref|", float(np.max(np.abs(ref))))
