"""Interfaces every KV transfer backend implements.

kvtrace fixture: written by hand in the shape of SGLang's disaggregation package.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import numpy.typing as npt


class KVPoll:
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


@dataclass
class KVArgs:
    engine_rank: int
    kv_data_ptrs: List[int] = field(default_factory=list)
    kv_data_lens: List[int] = field(default_factory=list)
    aux_data_ptrs: List[int] = field(default_factory=list)
    aux_data_lens: List[int] = field(default_factory=list)
    ib_device: Optional[str] = None


class BaseKVManager(ABC):
    """Owns the transfer engine and the per-room status table of one rank."""

    @abstractmethod
    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend=False):
        ...


class BaseKVSender(ABC):
    """Prefill side of one request's KV transfer."""

    @abstractmethod
    def __init__(self, mgr: BaseKVManager, bootstrap_addr: str, bootstrap_room: int):
        ...

    @abstractmethod
    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        """Say how many KV pages will follow and where the metadata lives."""

    @abstractmethod
    def send(self, kv_indices: npt.NDArray[np.int32]):
        """Queue one chunk of KV pages for transfer."""

    @abstractmethod
    def poll(self) -> KVPoll:
        """Report how far the transfer has got."""

    @abstractmethod
    def abort(self) -> None:
        """Give up on the transfer; later polls are expected to say Failed."""

    @abstractmethod
    def failure_exception(self):
        """Raise the error that ended the transfer."""


class BaseKVReceiver(ABC):
    """Decode side of one request's KV transfer."""

    @abstractmethod
    def __init__(self, mgr: BaseKVManager, bootstrap_addr: str, bootstrap_room: Optional[int] = None):
        ...

    @abstractmethod
    def init(self, kv_indices: npt.NDArray[np.int32], aux_index: Optional[int] = None):
        ...

    @abstractmethod
    def poll(self) -> KVPoll:
        ...

    @abstractmethod
    def failure_exception(self):
        ...
