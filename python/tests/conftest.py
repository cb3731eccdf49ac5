"""Shared fixtures: the backend under test and GPU peer libraries.

The suite runs on the backend named by ``CUDABUF_BACKEND`` (default: the simulator).
Tests that need a GPU peer library (PyTorch, CuPy, JAX) or CUDA itself are skipped with a
visible reason when it is absent, and fail instead when ``CUDABUF_REQUIRE_CUDA=1``.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Iterator

import pytest

import cudabuf
from cudabuf import cuda

REQUIRE_CUDA = os.environ.get("CUDABUF_REQUIRE_CUDA", "") == "1"


def backend_name() -> str:
    """The backend this run tests (``CUDABUF_BACKEND``, default ``sim``)."""
    return os.environ.get("CUDABUF_BACKEND", "").strip() or "sim"


def unavailable(reason: str) -> None:
    """Skip with ``reason``, or fail when CUDABUF_REQUIRE_CUDA=1."""
    if REQUIRE_CUDA:
        pytest.fail(f"CUDABUF_REQUIRE_CUDA=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(autouse=True, scope="session")
def _select_backend() -> Iterator[None]:
    cudabuf.set_backend(backend_name())
    yield


@pytest.fixture
def ctx() -> cuda.Context:
    """Device 0's context of the backend under test."""
    return cuda.Context(0)


@pytest.fixture
def on_cuda() -> bool:
    """Whether the backend under test is CUDA."""
    return cudabuf.get_backend() == "cuda"


@pytest.fixture
def cuda_only() -> None:
    """Skip (or fail with CUDABUF_REQUIRE_CUDA=1) unless the backend is CUDA."""
    if cudabuf.get_backend() != "cuda":
        unavailable("needs the cuda backend (CUDABUF_BACKEND=cuda on a machine with a GPU)")


@pytest.fixture
def sim_only() -> None:
    """Skip unless the backend is the simulator (simulator-specific behaviour)."""
    if cudabuf.get_backend() != "sim":
        pytest.skip("simulator-specific behaviour; this run uses the cuda backend")


def gpu_library(name: str) -> ModuleType:
    """Import a GPU peer library, or skip (fail with CUDABUF_REQUIRE_CUDA=1) when it or
    CUDA is absent."""
    if cudabuf.get_backend() != "cuda":
        unavailable(f"{name} interop needs the cuda backend (this run uses the simulator)")
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        unavailable(f"{name} is not installed ({e})")
        raise
    return module


@pytest.fixture
def torch() -> ModuleType:
    module = gpu_library("torch")
    if not module.cuda.is_available():
        unavailable("torch.cuda.is_available() is False")
    return module


@pytest.fixture
def cupy() -> ModuleType:
    return gpu_library("cupy")


@pytest.fixture
def jax() -> ModuleType:
    module = gpu_library("jax")
    if not any(d.platform == "gpu" for d in module.devices()):
        unavailable("JAX sees no GPU")
    return module
