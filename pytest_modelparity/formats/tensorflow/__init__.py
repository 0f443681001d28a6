"""The TensorFlow forms: one module per format (``keras``, ``h5``, ``saved_model``,
``checkpoint``, ``graphdef``), what a Keras model takes and returns (``keras_specs``), TF1
graphs, sessions and freezing (``graph``), a frozen graph or checkpoint as converter input
(``graph_source``), the serving function the converters trace (``serving``) and the float32
plan of a mixed-precision model (``mixed_precision``)."""
