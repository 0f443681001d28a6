"""The comparison engine: outputs close or not, by how much, where, under which tolerance, and
the failure text. numpy only: nothing here imports TensorFlow or any other folder but ``errors``.
"""
