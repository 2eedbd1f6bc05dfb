"""Stands in, in a source checkout, for the repository's top-level ``variants/`` folder.

An install maps that folder onto this package (setup.py's ``package_dir``) and leaves this file out.
From a checkout (the repository's root on ``sys.path``, or an editable install, which finds this
file first) the package's modules are found in that folder and its ``__init__.py`` runs here, so
``grpo_lightning.variants`` is the same code, with the same ``__file__``, however it was found.
"""

from pathlib import Path

__path__ = [str(Path(__file__).resolve().parents[2] / "variants")]
__file__ = str(Path(__path__[0]) / "__init__.py")
exec(compile(Path(__file__).read_text(encoding="utf-8"), __file__, "exec"))  # noqa: S102 - the folder's own __init__
