"""Which ops stop the float64 graph twin: 32 small Keras models (resizes of every kind, transposed,
recurrent, attention, STFT, 3-D...), each frozen and run through ``graph_twin.build(frozen,
"float64")``; prints ``name: OK dtype float64 e32=<max |twin - float32| / max |twin|>`` or the
failure (the op the rewrite stops at). docs/tolerances.md quotes it.

    PYTHONPATH=. python bench/twin_ops.py [name ...]
"""
import numpy as np, keras, tensorflow as tf, sys, traceback
from pytest_modelparity import load_model
from pytest_modelparity.floor import graph_twin
L = keras.layers
def m_img(fn, shape=(16, 16, 3)):
    x = keras.Input(shape); return keras.Model(x, fn(x))
models = {
 "upsample_bilinear": lambda: m_img(lambda x: L.Conv2D(4, 3, padding="same")(L.UpSampling2D(interpolation="bilinear")(x))),
 "upsample_nearest": lambda: m_img(lambda x: L.Conv2D(4, 3, padding="same")(L.UpSampling2D()(x))),
 "resize_bilinear": lambda: m_img(lambda x: L.Resizing(24, 20, interpolation="bilinear")(x)),
 "resize_nearest": lambda: m_img(lambda x: L.Resizing(24, 20, interpolation="nearest")(x)),
 "resize_bicubic": lambda: m_img(lambda x: L.Resizing(24, 20, interpolation="bicubic")(x)),
 "resize_area": lambda: m_img(lambda x: L.Resizing(24, 20, interpolation="area")(x)),
 "resize_lanczos3": lambda: m_img(lambda x: L.Resizing(24, 20, interpolation="lanczos3")(x)),
 "resize_crop": lambda: m_img(lambda x: L.Resizing(12, 12, crop_to_aspect_ratio=True)(x)),
 "resize_antialias": lambda: m_img(lambda x: L.Lambda(lambda a: tf.image.resize(a, (6, 5), antialias=True))(x)),
 "resize_gaussian": lambda: m_img(lambda x: L.Lambda(lambda a: tf.image.resize(a, (20, 22), method="gaussian"))(x)),
 "resize_mitchell": lambda: m_img(lambda x: L.Lambda(lambda a: tf.image.resize(a, (20, 22), method="mitchellcubic"))(x)),
 "v1_bicubic_align": lambda: m_img(lambda x: L.Lambda(lambda a: tf.compat.v1.image.resize_bicubic(a, (20, 22), align_corners=True))(x)),
 "v1_area": lambda: m_img(lambda x: L.Lambda(lambda a: tf.compat.v1.image.resize_area(a, (7, 5)))(x)),
 "conv_then_lanczos": lambda: m_img(lambda x: L.Resizing(24, 20, interpolation="lanczos5")(L.Conv2D(4, 3)(x))),
 "conv_then_antialias": lambda: m_img(lambda x: L.Lambda(lambda a: tf.image.resize(a, (5, 4), antialias=True, method="bilinear"))(L.Conv2D(4, 3)(x))),
 "conv_transpose": lambda: m_img(lambda x: L.Conv2DTranspose(4, 3, strides=2, padding="same")(x)),
 "convlstm": lambda: m_img(lambda x: L.ConvLSTM2D(4, 3, padding="same")(x), shape=(3, 8, 8, 2)),
 "gru": lambda: m_img(lambda x: L.GRU(4)(x), shape=(5, 3)),
 "attention": lambda: m_img(lambda x: L.MultiHeadAttention(2, 4)(x, x), shape=(6, 8)),
 "layernorm_gelu": lambda: m_img(lambda x: L.Dense(4, activation="gelu")(L.LayerNormalization()(x)), shape=(6, 8)),
 "stft_mel": lambda: m_img(lambda x: L.Lambda(lambda a: tf.math.log(tf.tensordot(tf.abs(tf.signal.stft(a, 64, 32)), tf.signal.linear_to_mel_weight_matrix(8, 33, 8000), 1) + 1e-6))(x), shape=(256,)),
 "batchnorm_pool": lambda: m_img(lambda x: L.GlobalAveragePooling2D()(L.MaxPooling2D()(L.BatchNormalization()(L.Conv2D(4, 3)(x))))),
 "separable": lambda: m_img(lambda x: L.SeparableConv2D(4, 3)(x)),
 "avgpool_softmax": lambda: m_img(lambda x: L.Softmax()(L.Flatten()(L.AveragePooling2D(2)(x)))),
 "crop_pad": lambda: m_img(lambda x: L.ZeroPadding2D(2)(L.Cropping2D(1)(x))),
 "hard_swish": lambda: m_img(lambda x: L.Activation("hard_swish")(L.Conv2D(4, 3)(x))),
 "dilated": lambda: m_img(lambda x: L.Conv2D(4, 3, dilation_rate=2)(x)),
 "conv1d_transpose": lambda: m_img(lambda x: L.Conv1DTranspose(4, 3, strides=2)(x), shape=(8, 3)),
 "conv3d": lambda: m_img(lambda x: L.MaxPooling3D()(L.Conv3D(4, 3, padding="same")(x)), shape=(4, 8, 8, 2)),
 "upsample3d": lambda: m_img(lambda x: L.UpSampling3D()(x), shape=(2, 4, 4, 2)),
 "depth_to_space": lambda: m_img(lambda x: L.Lambda(lambda a: tf.nn.depth_to_space(a, 2))(L.Conv2D(8, 1)(x))),
 "sigmoid_heads": lambda: m_img(lambda x: [L.Conv2D(2, 1, activation="sigmoid")(x), L.Conv2D(4, 1)(L.MaxPooling2D()(x))]),
}
only = sys.argv[1:] or list(models)
for name in only:
    try:
        model = models[name]()
        ref = load_model(model)
        shape = tuple(d or 2 for d in model.inputs[0].shape)
        x = np.random.default_rng(0).normal(size=shape).astype("float32")
        frozen = ref.frozen_graph()
        twin = graph_twin.build(frozen, "float64")
        outs = twin.run([x])
        r = ref.predict(x); r = list(r.values())
        e = max(float(np.abs(o - np.asarray(a, np.float64)).max() / (np.abs(o).max() or 1)) for o, a in zip(outs, r))
        print(f"{name}: OK dtype {outs[0].dtype} e32={e:.2g}", flush=True)
    except Exception as exc:
        print(f"{name}: FAIL {type(exc).__name__}: {str(exc)[:300]}", flush=True)
