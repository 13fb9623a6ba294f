"""Cheap pickling for what crosses a Serve hop: tensors go as numpy arrays and generators as their state,
about ten times faster than torch's own reduce, and the orchestrator pays it on every call of every round."""

import numpy as np
import torch


class _Array:
    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array


class _Generator:
    __slots__ = ("state",)

    def __init__(self, state: np.ndarray):
        self.state = state


def pack(value):
    if isinstance(value, torch.Tensor) and value.device.type == "cpu":
        return _Array(value.numpy())
    if isinstance(value, torch.Generator) and value.device.type == "cpu":
        return _Generator(value.get_state().numpy())
    return value


def unpack(value):
    if isinstance(value, _Array):
        return torch.from_numpy(value.array)
    if isinstance(value, _Generator):
        generator = torch.Generator()
        generator.set_state(torch.from_numpy(value.state))
        return generator
    return value


class CompactPickle:
    """Mixin for slotted dataclasses holding CPU tensors or generators."""

    __slots__ = ()

    def __getstate__(self) -> dict:
        return {name: pack(getattr(self, name)) for name in self.__dataclass_fields__}

    def __setstate__(self, state: dict) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, unpack(value))
