"""Which TensorFlow ops an untrusted graph may hold: those known to compute (issue 48).

Why an allowlist: a list of what is refused leaves the rest allowed, and TensorFlow registers
about 1,500 ops, more each release. So an op runs untrusted only when it is known to compute: a
value from its inputs, or a variable, table, list or queue held in memory.

How the list is derived, not hand-picked op by op: TensorFlow generates each op's Python
wrapper into a module named for what its ops do (``gen_math_ops``, ``gen_io_ops``...). An op
is read from ``tf.raw_ops`` and placed in the module that defines it; each module is judged
once, below, with the reason. Ops of no such module (an internal ``_Fused...`` op, a custom op
library, an op of XLA or TPU) are not known, so refused. The ops that reach out although their
module computes (``RecordInput`` among the queues, a vocabulary's ``InitializeTableFromTextFile``,
``PrintV2`` to a file) keep their own rules in ``trust.REACHING_OPS``, checked first. Tests
check that every op tensorflowjs and tf2onnx map is allowed here, and that every op outside the
list is refused by the scan.
"""

from __future__ import annotations

import functools

# module -> why its ops compute
COMPUTE_MODULES: dict[str, str] = {
    **dict.fromkeys(("gen_math_ops", "gen_nn_ops", "gen_array_ops", "gen_bitwise_ops", "gen_linalg_ops",
                     "gen_special_math_ops", "gen_spectral_ops", "gen_manip_ops", "gen_image_ops",
                     "gen_audio_ops", "gen_string_ops", "gen_parsing_ops", "gen_sparse_ops",
                     "gen_sparse_csr_matrix_ops", "gen_ragged_array_ops", "gen_ragged_conversion_ops",
                     "gen_ragged_math_ops", "gen_set_ops", "gen_count_ops", "gen_ctc_ops", "gen_rnn_ops",
                     "gen_cudnn_rnn_ops", "gen_uniform_quant_ops", "gen_composite_tensor_ops",
                     "gen_clustering_ops", "gen_candidate_sampling_ops", "gen_random_ops",
                     "gen_random_index_shuffle_ops", "gen_stateless_random_ops", "gen_stateless_random_ops_v2",
                     "gen_stateful_random_ops"),
                    "a value from its inputs"),
    **dict.fromkeys(("gen_control_flow_ops", "gen_functional_ops"),
                    "control flow over the graph's own functions (their bodies are scanned too)"),
    **dict.fromkeys(("gen_resource_variable_ops", "gen_state_ops", "gen_training_ops", "gen_lookup_ops",
                     "gen_list_ops", "gen_map_ops", "gen_data_flow_ops", "gen_optional_ops",
                     "gen_boosted_trees_ops", "gen_sdca_ops"),
                    "variables, tables, lists and queues held in memory"),
    "gen_logging_ops": "asserts, and prints to the process's own output",
}

# module -> what its ops reach (the refusal's words)
REFUSED_MODULES: dict[str, str] = {
    "gen_io_ops": "files (checkpoint and file readers and writers; the model's own saver is allowed by structure)",
    "gen_checkpoint_ops": "files (another checkpoint's tensors)",
    "gen_filesystem_ops": "the file system's configuration",
    "gen_summary_ops": "files (summary writers)",
    "gen_dataset_ops": "input pipelines that read, cache or serve data (a dataset is not part of a prediction)",
    "gen_experimental_dataset_ops": "input pipelines that read, cache or serve data (a dataset is not part of "
                                    "a prediction)",
    "gen_script_ops": "Python code",
    "gen_debug_ops": "a debug server or dump folder",
    "gen_decode_proto_ops": "files (a descriptor source)",
    "gen_encode_proto_ops": "files (a descriptor source)",
    **dict.fromkeys(("gen_collective_ops", "gen_nccl_ops", "gen_sendrecv_ops", "gen_sync_ops"),
                    "other devices or processes"),
    **dict.fromkeys(("gen_tpu_ops", "gen_tpu_partition_ops"), "TPU hardware and its host"),
    "gen_batch_ops": "batches shared across callers (a serving queue)",
}

# Registered outside tf.raw_ops, yet compute: Grappler's fusions of a convolution or matmul with
# its bias and activation, which tensorflowjs maps (a frozen graph written after Grappler holds
# them). A test checks that every registered op the converters map is allowed.
FUSED_INTERNAL = frozenset({"_FusedConv2D", "_FusedMatMul"})

UNKNOWN = "an op of no TensorFlow library the scan knows (internal, XLA, TPU or a custom op library)"


@functools.lru_cache(maxsize=1)
def op_modules() -> dict[str, str]:
    """Every op of ``tf.raw_ops`` -> the ``gen_*_ops`` module that defines it."""
    import importlib

    import tensorflow as tf

    raw = set(dir(tf.raw_ops))
    found: dict[str, str] = {}
    for module_name in (*COMPUTE_MODULES, *REFUSED_MODULES):
        try:
            module = importlib.import_module(f"tensorflow.python.ops.{module_name}")
        except ImportError:  # a module this TensorFlow does not have: its ops are unknown
            continue
        for name in dir(module):
            if name in raw:
                found.setdefault(name, module_name)
    return found


def not_known_to_compute(op: str) -> str | None:
    """None when ``op`` computes (see above); else what it reaches, for the refusal."""
    module = op_modules().get(op)
    if module in COMPUTE_MODULES or op in FUSED_INTERNAL:
        return None
    if module in REFUSED_MODULES:
        return REFUSED_MODULES[module]
    return UNKNOWN


def module_of(op: str) -> str | None:
    return op_modules().get(op)
