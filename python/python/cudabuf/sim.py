"""``cudabuf.sim``: a simulator of your own, for tests.

The simulator backend (``CUDABUF_BACKEND=sim``, the default) is host memory that behaves
like CUDA device memory and enforces CUDA's rules: capacity, addresses of another device,
use after free. :class:`Simulator` makes an instance of its own, configured here, whose
contexts (:meth:`Simulator.context`) allocate from it alone, so a test sees exactly what
its own code allocated and leaked, and can make calls fail on purpose::

    from cudabuf import sim

    s = sim.Simulator(devices=1, capacity=1 << 20)
    ctx = s.context(0)
    s.fail_nth("allocate", 2)        # the 2nd allocation from now: OutOfMemoryError
    a = ctx.new_buffer(64)
    # ctx.new_buffer(64) -> raises cudabuf.OutOfMemoryError
    del a
    s.assert_clean()                 # raises SimulatorNotCleanError on a leak or a race

Defaults (those of the Rust ``SimConfig``): 2 devices of 1 GiB (:data:`DEFAULT_DEVICES`,
:data:`DEFAULT_CAPACITY`); new device memory is filled with the byte ``0xA5``
(:data:`UNINIT_FILL`; ``cuMemAlloc`` does not clear memory, so a program reading what it
never wrote sees ``0xA5``, not zeros; ``fill=`` chooses another byte, e.g. ``fill=0x00``;
pinned host memory is zero-filled whatever ``fill`` is); the stream scheduler's ``seed``,
``schedule`` and race mode ``races`` come from ``CUDABUF_SIM_SEED`` (else 0),
``CUDABUF_SIM_SCHEDULE`` (else ``"deterministic"``) and ``CUDABUF_SIM_RACES`` (else
``"fail"``) when not given.

Like CUDA, a simulator belongs to the process that made it: in a child made by
``os.fork`` (or multiprocessing's ``"fork"`` start method) every call through the
parent's simulator, contexts and buffers raises :class:`~cudabuf.NoDriverError`
(CUDA's ``CUDA_ERROR_NOT_INITIALIZED``), as CUDA refuses a forked child its parent's
contexts. Make a new :class:`Simulator` in the child, or start children with the
``"spawn"`` or ``"forkserver"`` start method.

Streams (:class:`cudabuf.cuda.Stream`) run asynchronously under the scheduler, and the
race detector checks what Python issues: a missing ``wait_event`` or a read before a
``synchronize`` raises :class:`~cudabuf.DataRaceError` at the call that races
(``races="fail"``) and is kept in :meth:`Simulator.race_report` (``races="log"``: only
reported).

The pytest plugin (:mod:`cudabuf.pytest_plugin`) gives each test a fresh
:class:`Simulator` (the ``cudabuf_sim`` fixture) and fails it on a leak or a race.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import List

from cudabuf._errors import SimulatorNotCleanError
from cudabuf._native import Simulator as _NativeSimulator

__all__ = [
    "Simulator",
    "Leak",
    "LeakReport",
    "Race",
    "RaceReport",
    "SimulatorNotCleanError",
    "DEFAULT_DEVICES",
    "DEFAULT_CAPACITY",
    "UNINIT_FILL",
    "FAULT_OPS",
]

DEFAULT_DEVICES = 2
"""The number of devices of a simulator made without ``devices=``."""

DEFAULT_CAPACITY = 1 << 30
"""Each device's capacity in bytes (1 GiB) for a simulator made without ``capacity=``."""

UNINIT_FILL = 0xA5
"""The byte new device memory holds before anything is written to it, unless
:class:`Simulator`'s ``fill`` says otherwise."""

FAULT_OPS = ("allocate", "alloc_host", "copy", "ipc_export", "ipc_open", "synchronize")
"""The operations :meth:`Simulator.fail_nth` and :meth:`Simulator.fail_randomly` take."""


@dataclass(frozen=True)
class Leak:
    """One live allocation of a simulator."""

    device: int
    """The device it belongs to (for pinned memory: the device of the allocating context)."""
    kind: str
    """``"device"``, ``"pinned"`` or ``"ipc-mapping"``."""
    address: int
    """Its simulated device address."""
    size: int
    """Its size in bytes."""

    def __str__(self) -> str:
        return f"device {self.device} {self.kind} {self.address:#x} {self.size} bytes"


class LeakReport(List[Leak]):
    """The live allocations of a simulator, in address order (a list of :class:`Leak`);
    ``str()`` is the simulator's text report."""

    text: str

    def __init__(self, leaks: List[Leak], text: str) -> None:
        super().__init__(leaks)
        self.text = text

    @property
    def total_bytes(self) -> int:
        """The sum of the sizes."""
        return sum(leak.size for leak in self)

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Race:
    """One data race the simulator detected."""

    operation: str
    """The later operation: read or write, what, which stream, which thread."""
    conflicting: str
    """The earlier operation it is not ordered after."""
    range: str
    """The bytes both touch: which buffer, which range, which allocation."""
    hint: str
    """What would order the two operations."""
    message: str
    """The whole description, as the ``DataRace`` error says it."""

    def __str__(self) -> str:
        return self.message


class RaceReport(List[Race]):
    """The data races a simulator detected, oldest first (a list of :class:`Race`, the
    first 1024); ``dropped`` counts those not kept; ``str()`` is the text report."""

    text: str
    dropped: int

    def __init__(self, races: List[Race], dropped: int, text: str) -> None:
        super().__init__(races)
        self.dropped = dropped
        self.text = text

    def __str__(self) -> str:
        return self.text


class Simulator(_NativeSimulator):
    """A simulator instance of its own: ``devices`` devices of ``capacity`` bytes each.

    ``Simulator(devices=2, capacity=1 << 30, *, seed=None, schedule=None, races=None,
    name=None, fill=0xA5)``: ``schedule`` is ``"deterministic"`` or ``"threaded"``,
    ``races`` is ``"fail"``, ``"log"`` or ``"off"``; ``None`` takes ``CUDABUF_SIM_SEED``,
    ``CUDABUF_SIM_SCHEDULE``, ``CUDABUF_SIM_RACES`` or the default (see the module).
    ``name`` names the devices and the reports (default ``"cudabuf simulated device"``).
    ``fill`` is the byte new device memory holds (:data:`UNINIT_FILL` by default;
    ``fill=0x00`` makes it look cleared).

    Its contexts (:meth:`context`) and host buffers (:meth:`new_host_buffer`) allocate
    from this instance only, whatever ``cudabuf.set_backend`` says; everything made from
    them keeps working after the simulator object is gone.

    Raises:
        InvalidArgumentError: more devices than the simulator supports, a negative
            number, a ``fill`` outside 0..255, or an unknown ``schedule`` / ``races``
            (also one taken from the environment).
    """

    def leak_report(self) -> LeakReport:
        """The allocations still live on this simulator (device memory, pinned host
        memory, IPC mappings): empty once every buffer is gone."""
        entries, text = self._leaks()
        return LeakReport([Leak(*entry) for entry in entries], text)

    def race_report(self) -> RaceReport:
        """The data races detected so far (``races="fail"`` or ``"log"``)."""
        entries, dropped, text = self._races()
        return RaceReport([Race(*entry) for entry in entries], dropped, text)

    def assert_clean(self) -> None:
        """Raise :class:`~cudabuf.SimulatorNotCleanError`, naming each one, if this
        simulator has detected a data race or still holds allocations: the end of a
        test, once its buffers are dropped. Collects garbage first, so that buffers kept
        only by reference cycles do not count.

        Raises:
            SimulatorNotCleanError: with ``leaks`` and ``races`` set to the reports.
        """
        gc.collect()
        races = self.race_report()
        leaks = self.leak_report()
        if not races and races.dropped == 0 and not leaks:
            return
        races_text = str(races) if races or races.dropped else "no data races"
        leaks_text = str(leaks) if leaks else "no allocations held"
        raise SimulatorNotCleanError(
            f"the simulator is not clean:\n{races_text}\n{leaks_text}",
            leaks=list(leaks),
            races=list(races),
        )
