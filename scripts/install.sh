#!/usr/bin/env bash
# Set up .venv with the plugin, every optional runtime and the test tools.
# Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
# tensorflowjs' own pins pull TensorFlow 2.19 and an old protobuf, which break TF 2.21:
# install the converter without its dependencies (see README "TensorFlow.js").
.venv/bin/python -m pip install -q --no-deps 'tensorflowjs==4.22.0' 'tensorflow_hub==0.16.1'
# tf_keras (Keras 2) only for the tests: tests/test_trained_forms.py writes a Keras-2-era SavedModel
# with its legacy optimizer, as many trained models in the wild were written. --no-deps: its pin
# on `tensorflow` would pull a second TensorFlow over tensorflow-cpu. The plugin never imports it.
.venv/bin/python -m pip install -q --no-deps 'tf_keras==2.21.0'
# scikit-learn beside the venv, not in it: Keras imports it (and SciPy) in every process that
# imports TensorFlow when it is installed, 1.3 CPU-s each over the suite's ~100 such processes.
# One test needs a user environment that has it (tests/test_session_faults.py: SciPy's OpenBLAS
# under `ulimit -v`) and puts this folder on its session's PYTHONPATH. Constrained to the venv's
# versions, so the numpy it brings along is the venv's own, except ml_dtypes: the venv keeps it
# below 0.7 (pyproject.toml's test extra: 0.7.0's import is 1.3 CPU-s dearer), and that test's
# address-space limit was measured in the environment a user's pip resolves, with 0.7.0.
ASIDE=.venv/aside-sklearn
ASIDE_ML_DTYPES=0.7.0
if [ ! -d "$ASIDE/sklearn" ] || [ ! -d "$ASIDE/ml_dtypes-$ASIDE_ML_DTYPES.dist-info" ]; then
  rm -rf "$ASIDE"
  .venv/bin/python -m pip list --format=freeze | grep -iv '^ml.dtypes==' > .venv/aside-constraints.txt
  .venv/bin/python -m pip install -q --target "$ASIDE" -c .venv/aside-constraints.txt 'scikit-learn>=1.3' \
      "ml_dtypes==$ASIDE_ML_DTYPES"
fi
# The Node.js side of the TFJS format: npm ci into the runner cache ahead of time (it would
# otherwise run on first use). Skipped, with a note, where Node.js/npm are missing.
if command -v node >/dev/null && command -v npm >/dev/null; then
  .venv/bin/python -m pytest_modelparity.tfjs_runner install
else
  echo "install.sh: Node.js/npm not found; the tfjs format will be skipped (apt-get install nodejs npm)" >&2
fi
# The browser formats (tfjs:webgl, tfjs:webgl-f16, tfjs:webgpu) run the system Chromium headless
# (no browser is downloaded by npm), and the HTML report's layout tests lay pages out in it at
# 1280 px (tests/test_html_report.py): installed with apt where this runs as root (CI's fresh
# machine) or with password-less sudo, else said how; without one those formats and tests skip
# (docs/tfjs.md "In a browser").
if [ -n "${MODELPARITY_CHROMIUM:-}" ] || command -v chromium >/dev/null || command -v chromium-browser >/dev/null \
    || command -v google-chrome >/dev/null; then
  :
elif command -v apt-get >/dev/null && { [ "$(id -u)" = 0 ] || { command -v sudo >/dev/null && sudo -n true 2>/dev/null; }; }; then
  as_root=""
  [ "$(id -u)" = 0 ] || as_root="sudo -n"
  echo "install.sh: installing Chromium for the tfjs browser formats and the HTML layout tests" \
       "(apt-get install chromium, ~300 MB)"
  export DEBIAN_FRONTEND=noninteractive
  if ! $as_root apt-get install -y -q chromium >/dev/null 2>&1; then
    $as_root apt-get update -q >/dev/null 2>&1 || true
    $as_root apt-get install -y -q chromium >/dev/null 2>&1 \
      || echo "install.sh: apt-get install chromium failed; the tfjs:webgl formats and the HTML layout tests" \
              "will be skipped" >&2
  fi
else
  echo "install.sh: no Chromium found; the tfjs:webgl formats and the HTML layout tests will be skipped (as root:" \
       "apt-get install chromium; or set MODELPARITY_CHROMIUM=/path/to/chrome)" >&2
fi
# The headless shell (Debian's chromium-headless-shell, ~200 MB beside chromium) is what the browser
# formats prefer: the same engine without the full browser's background services, so a session
# makes no network request at all (docs/security.md "The browser"). Best effort: without it the
# full browser runs, and its own services knock at the driver's loopback sink.
if [ -z "${MODELPARITY_CHROMIUM:-}" ] && ! command -v chromium-headless-shell >/dev/null \
    && ! command -v chrome-headless-shell >/dev/null && command -v apt-get >/dev/null \
    && { [ "$(id -u)" = 0 ] || { command -v sudo >/dev/null && sudo -n true 2>/dev/null; }; }; then
  as_root=""
  [ "$(id -u)" = 0 ] || as_root="sudo -n"
  echo "install.sh: installing chromium-headless-shell for the tfjs browser formats (apt-get, ~200 MB)"
  export DEBIAN_FRONTEND=noninteractive
  $as_root apt-get install -y -q chromium-headless-shell >/dev/null 2>&1 \
    || { $as_root apt-get update -q >/dev/null 2>&1; $as_root apt-get install -y -q chromium-headless-shell >/dev/null 2>&1; } \
    || echo "install.sh: apt-get install chromium-headless-shell failed; the full Chromium will run" \
            "the browser formats" >&2
fi
# pip check: tensorflowjs and tensorflow_hub were installed with --no-deps on purpose, so
# their unmet pins (jax, flax, tf-keras, tensorflow-decision-forests, packaging~=23.1, ...)
# are expected: count them in one line; anything else pip reports is shown as it is.
check=$(.venv/bin/python -m pip check 2>&1 || true)
intended=$(printf '%s\n' "$check" | grep -cE '^(tensorflowjs|tensorflow-hub|tensorflow_hub|tf-keras) ' || true)
others=$(printf '%s\n' "$check" | grep -vE '^(tensorflowjs|tensorflow-hub|tensorflow_hub|tf-keras) ' | grep -v '^No broken requirements' | grep -v '^$' || true)
if [ "$intended" -gt 0 ]; then
  echo "install.sh: pip check: $intended expected unmet pin(s) of tensorflowjs/tensorflow_hub/tf_keras (installed with --no-deps; their converter path used here needs none of them)"
fi
if [ -n "$others" ]; then
  echo "install.sh: pip check reports (not expected):" >&2
  printf '%s\n' "$others" >&2
else
  echo "install.sh: pip check: no other broken requirements"
fi
