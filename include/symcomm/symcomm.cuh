// symcomm device library — the umbrella header. Include this from any kernel:
//
//     #include <symcomm/symcomm.cuh>
//
// Handles (`DevComm`, `WindowHandleRaw`) come from the host by value as kernel arguments
// (abi.h). Headers, one per concept, each holding declarations and their contracts (who calls,
// pre/post-conditions, ordering, returns); the inline definitions are in impl/, which each header
// includes at its end (PTX and emulator variants in separate files, e.g. impl/memory_ptx.cuh and
// impl/memory_emu.cuh, chosen by one #if):
//   config.cuh   compiler detection (nvcc, NVRTC, emulator), SYMCOMM_DEVICE, SYMCOMM_EMU_KERNEL
//   group.cuh    cooperating groups (first argument of every primitive)
//   memory.cuh   acquire/release/relaxed loads, stores and atomics at .gpu/.sys scope; clocks
//   signal.cuh   per-peer signal slots, bounded waits (thread, warp, CTA), error records
//   semaphore.cuh  semaphores: signal counts with the waiter's expected count in device memory
//   grid.cuh     grid_sync across the CTAs of one launch (co-resident grids)
//   window.cuh   peer addressing in symmetric windows; WindowSlice (win.at(offset)) for arguments
//   types.cuh    element types: DataType codes, f16/bf16/fp8 storage types and conversions, traits
//   reduce.cuh   reduction operators: RedOp codes, Accumulator, 16-byte packs, run-time dispatch
//   barrier.cuh  barriers across ranks, with fingerprints (collectives' and user_fingerprint)
//   collectives.cuh  all-reduce, all-gather, ... over windows, at grid or CTA scope
//   p2p.cuh      put / get / put_with_signal between ranks
//   fused.cuh    building blocks of fused kernels: peer reductions into registers, CTA/warp reductions
#pragma once

#include <symcomm/abi.h>
#include <symcomm/config.cuh>
#include <symcomm/group.cuh>
#include <symcomm/memory.cuh>
#include <symcomm/reduce.cuh>
#include <symcomm/signal.cuh>
#include <symcomm/semaphore.cuh>
#include <symcomm/grid.cuh>
#include <symcomm/types.cuh>
#include <symcomm/window.cuh>
#include <symcomm/barrier.cuh>
#include <symcomm/collectives.cuh>
#include <symcomm/p2p.cuh>
#include <symcomm/fused.cuh>
