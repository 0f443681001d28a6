"""The command ``python -m pytest_modelparity.tfjs_runner install|path|check``.

Only the command lives at this path (it is public, in every CI recipe); the runner itself, its
npm lockfile and the Node.js process are in ``runtime/tfjs_runner``.
"""
