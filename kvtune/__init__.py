"""kvtune: a capacity optimizer for LLM serving.

The distribution installs this one top-level package. Its subpackages sit at the repository root,
where the design card fixes them, and ``pyproject.toml`` maps them under ``kvtune``:

- ``kvtune.costmodel`` is ``costmodel/``: hardware, model architectures, memory, step times,
  calibration and the serving simulator (pure; never imports ``kvtune.optimizer``);
- ``kvtune.optimizer`` is ``optimizer/``: the workload file, the search, recommendations, reports
  and the ``kvtune`` command;
- ``kvtune.profiles`` is ``profiles/``: shipped calibrations, model configs and measured tables.

An editable install (``pip install -e .``) maps them with setuptools' import finder; a wheel
copies them into ``kvtune/``.
"""

__version__ = "0.1.0"  # the one version source: pyproject.toml, the CLI and every JSON written read it

__all__ = ["__version__"]
