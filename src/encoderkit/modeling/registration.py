"""Which parameters a packed copy of weights was made from: the process-wide count of parameter registrations, and
the identity check of a module's parameters. A module of its own so that the native library's layout
(``encoderkit.native``) and ``modeling.inference`` both use it without importing each other."""
from __future__ import annotations

import torch
from torch import nn

# Parameters registered on any module of this process since encoderkit was imported, counted by torch's global
# registration hook. A packed copy made from a module's parameters looks whether they are still the module's only when
# the count moved: replacing one (``load_state_dict(assign=True)``, ``module.weight = nn.Parameter(...)``) registers
# the new one, and walking a model's modules at every call would cost more than the call's Python.
_REGISTERED = [0]


def _count_registration(module: nn.Module, name: str, parameter: nn.Parameter | None) -> None:
    _REGISTERED[0] += 1


torch.nn.modules.module.register_module_parameter_registration_hook(_count_registration)


def parameters_registered() -> int:
    """How many parameters modules have registered since encoderkit was imported (see ``_REGISTERED``)."""
    return _REGISTERED[0]


def replaced(held: list[torch.Tensor], current: list[torch.Tensor]) -> bool:
    """Whether ``current`` (a module's parameters now) are other tensors than ``held``, by identity."""
    return len(held) != len(current) or any(a is not b for a, b in zip(held, current))
