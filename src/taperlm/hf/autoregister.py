"""Register taperlm with transformers' Auto classes *when the user imports them*, not when
they import taperlm.

Importing our modeling code costs ~1.5-2.5 s (transformers' PreTrainedModel + torch), too much to
pay on every `import taperlm`. Instead `install()` (called by `taperlm/__init__.py`) adds a
meta-path hook that runs after transformers' own `configuration_auto` / `modeling_auto` modules
execute — i.e. only in processes that use AutoConfig / AutoModelForCausalLM — and registers the
config, then the model, there. If those modules are already imported, it registers at once.
The hook never imports transformers itself and does nothing when it is not installed.
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings
from collections.abc import Callable
from typing import Any

from taperlm.hf import register, register_config

CONFIG_MODULE = "transformers.models.auto.configuration_auto"
MODEL_MODULE = "transformers.models.auto.modeling_auto"


def _register_config() -> None:
    register_config()


def _register_model() -> None:
    register()


_ACTIONS: dict[str, Callable[[], None]] = {
    CONFIG_MODULE: _register_config,
    MODEL_MODULE: _register_model,
}


def _run(name: str) -> None:
    try:
        _ACTIONS[name]()
    except Exception as err:  # never break the user's transformers import
        warnings.warn(
            f"taperlm: could not register with transformers ({err}); call "
            "taperlm.hf.register() explicitly or load with trust_remote_code=True",
            stacklevel=2,
        )


class _Loader(importlib.abc.Loader):
    """Delegates to the real loader, then registers taperlm."""

    def __init__(self, inner: Any, name: str) -> None:
        self._inner, self._name = inner, name

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        _run(self._name)

    def __getattr__(self, attr: str) -> Any:  # get_source, get_code, ... for tooling
        return getattr(self._inner, attr)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in _ACTIONS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, name)
                return spec
        return None


def install() -> None:
    """Install the hook once; register immediately for Auto modules already imported."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    for name in _ACTIONS:
        if name in sys.modules:
            _run(name)
