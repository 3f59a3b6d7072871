"""The ``torch.cuda`` names that ``torch.musa`` mirrors, each checked in torch_musa's own source.

Read in MooreThreads/torch_musa at commit 8b583b3 (2026-01-19, torch_musa 2.x on torch 2.7.1+);
``torch.musa`` is the ``torch_musa`` package, so a name is a twin when ``torch_musa/__init__.py``
binds it (directly or by a star import of a module's ``__all__``). The file that defines each:

| names | defined in (torch_musa/...) |
|---|---|
| is_available, device_count, current_device, set_device, synchronize, get_device_name, get_device_capability, get_device_properties, can_device_access_peer, get_arch_list, is_bf16_supported, is_tf32_supported, device (class ``Device``), device_of (``DeviceOf``) | core/device.py |
| Stream, ExternalStream, Event, StreamContext, stream, set_stream, current_stream, default_stream | core/stream.py |
| empty_cache, memory_stats, memory_stats_as_nested_dict, memory_snapshot, memory_summary, memory_allocated, max_memory_allocated, memory_reserved, max_memory_reserved, reset_peak_memory_stats, reset_accumulated_memory_stats, reset_max_memory_allocated, reset_max_memory_cached, set_per_process_memory_fraction, mem_get_info, get_allocator_backend, change_current_allocator, MemPool, use_mem_pool | core/memory.py (``__all__``) |
| manual_seed, manual_seed_all, seed, seed_all, initial_seed, get_rng_state, get_rng_state_all, set_rng_state, set_rng_state_all | core/random.py (``__all__``) |
| default_generators | declared in core/_lazy_init.py, set by csrc/core/Module.cpp (``set_module_attr``) |
| init, is_initialized | core/_lazy_init.py |
| graph, graph_pool_handle, make_graphed_callables, is_current_stream_capturing; CUDAGraph is ``MUSAGraph`` | musa_graph/graphs.py |
| ipc_collect, OutOfMemoryError | __init__.py |

Not there (reported, left as is): for example ``utilization``, ``temperature``, ``power_draw``,
``memory_cached`` / ``max_memory_cached`` (old aliases), ``nvtx``, ``jiterator``, ``comm``, ``nccl``.
"""

from __future__ import annotations

__all__ = ["TWINS", "RENAMED"]

TWINS = frozenset({
    # core/device.py
    "is_available", "device_count", "current_device", "set_device", "synchronize", "get_device_name",
    "get_device_capability", "get_device_properties", "can_device_access_peer", "get_arch_list",
    "is_bf16_supported", "is_tf32_supported", "device", "device_of",
    # core/stream.py
    "Stream", "ExternalStream", "Event", "StreamContext", "stream", "set_stream", "current_stream",
    "default_stream",
    # core/memory.py
    "empty_cache", "memory_stats", "memory_stats_as_nested_dict", "memory_snapshot", "memory_summary",
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "reset_peak_memory_stats", "reset_accumulated_memory_stats", "reset_max_memory_allocated",
    "reset_max_memory_cached", "set_per_process_memory_fraction", "mem_get_info", "get_allocator_backend",
    "change_current_allocator", "MemPool", "use_mem_pool",
    # core/random.py
    "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state",
    "get_rng_state_all", "set_rng_state", "set_rng_state_all",
    # core/_lazy_init.py (+ csrc/core/Module.cpp for default_generators)
    "default_generators", "init", "is_initialized",
    # musa_graph/graphs.py
    "graph", "graph_pool_handle", "make_graphed_callables", "is_current_stream_capturing",
    # __init__.py
    "ipc_collect", "OutOfMemoryError",
})
#: torch.cuda name -> its torch.musa name, where the two differ (``--target musa``; reversed for cuda).
RENAMED = {"CUDAGraph": "MUSAGraph"}
