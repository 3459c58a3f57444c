# SpiNNUtils' AbstractBase is an ABCMeta.
from abc import ABCMeta as AbstractBase, abstractmethod  # noqa: F401
