"""Recorded runs, the format ``recorded``: a form's outputs on given inputs, written by one run
(``write.py``: ``record_outputs``, ``write_inputs``; the plugin's ``--modelparity-record``) or
by an app outside Python, and read back as a form that answers only those inputs (``load.py``).
``manifest.py`` is the manifest, ``arrays.py`` the checked files, ``provenance.py`` what
produced them. This package is the format's entry in the registry (load-only: no export).
"""

from .load import NAME, RecordedModel, detect, load
from .manifest import MANIFEST, read_manifest
from .write import Recording, record_outputs, write_inputs

EXPORT_REQUIRES: tuple = ()

__all__ = ["EXPORT_REQUIRES", "MANIFEST", "NAME", "RecordedModel", "Recording", "detect", "load", "read_manifest",
           "record_outputs", "write_inputs"]
