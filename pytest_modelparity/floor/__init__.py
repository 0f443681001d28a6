"""How far correct forms of a model can drift: the noise floor. ``measure`` (no TensorFlow)
measures a reference's own float32 error per output with the first faithful twin; ``twins``
builds the twins behind one interface: the Keras-config twin (``keras_twin``) and the graph
twin (``graph_twin``: the frozen graph in float64, or in float32 with its sums reordered)."""
