"""What runs under the formats: devices, importing TensorFlow, the Node.js process and its npm
packages, temporary directories, machine limits and quiet logs. Imports nothing of the package
but ``errors``.
"""
