// The device library's C ABI for Rust kernels (the `symcomm-kernel` crate, kernel/src/ffi.rs).
//
// This file: errors, signals and semaphores, barriers, put / get and the collectives'
// partitions; the collectives themselves are in ffi_collective_<type>.cu; what they share, and
// how the files are built, in ffi.cuh.
//
// The boundary carries scalars and pointers only (aggregates by value across `extern "C"` are
// not settled on nvptx): handles by pointer, statuses as SYMCOMM_STATUS_* codes, groups and
// scopes as the codes below. Every function is a collective call of the group it names, exactly
// as the C++ function it wraps (the contracts are in the headers); a code outside the ones below
// is a bug of the Rust wrapper, answered with SYMCOMM_STATUS_INVALID_ARGUMENT where a status is
// returned.
#include "ffi.cuh"

/// Group codes (`symcomm_kernel::Group::CODE`).
#define SYMCOMM_RS_THREAD 0u
#define SYMCOMM_RS_WARP 1u
#define SYMCOMM_RS_CTA 2u

/// Scope codes (`symcomm_kernel::Scope`): the values of symcomm::Scope.
#define SYMCOMM_RS_SCOPE_GPU 0u
#define SYMCOMM_RS_SCOPE_SYS 1u

namespace {

using namespace symcomm;

constexpr uint32_t kInvalid = SYMCOMM_STATUS_INVALID_ARGUMENT;

/// Calls `f(group)` for the group `code` names.
template <typename F>
SYMCOMM_DEVICE uint32_t with_group(uint32_t code, F f) {
    switch (code) {
        case SYMCOMM_RS_THREAD:
            return uint32_t(f(Thread{}));
        case SYMCOMM_RS_WARP:
            return uint32_t(f(Warp{}));
        case SYMCOMM_RS_CTA:
            return uint32_t(f(Cta{}));
        default:
            return kInvalid;
    }
}

/// Calls `f.template operator()<S>()`-style dispatch: `gpu()` or `sys()` for the scope `code`.
template <typename Gpu, typename Sys>
SYMCOMM_DEVICE uint32_t with_scope(uint32_t code, Gpu gpu, Sys sys) {
    switch (code) {
        case SYMCOMM_RS_SCOPE_GPU:
            return uint32_t(gpu());
        case SYMCOMM_RS_SCOPE_SYS:
            return uint32_t(sys());
        default:
            return kInvalid;
    }
}

/// An unsigned integer of `N` bytes: put / get and the partitions depend on the element size
/// only, so one instantiation per size serves every Rust element type of that size.
template <uint32_t N>
struct Bits;
template <>
struct Bits<1> {
    using type = uint8_t;
};
template <>
struct Bits<2> {
    using type = uint16_t;
};
template <>
struct Bits<4> {
    using type = uint32_t;
};
template <>
struct Bits<8> {
    using type = uint64_t;
};

/// Calls `f(T{})` with T the unsigned integer of `elem_size` bytes.
template <typename F>
SYMCOMM_DEVICE uint32_t with_size(uint32_t elem_size, F f) {
    switch (elem_size) {
        case 1:
            return f(Bits<1>::type{});
        case 2:
            return f(Bits<2>::type{});
        case 4:
            return f(Bits<4>::type{});
        case 8:
            return f(Bits<8>::type{});
        default:
            return kInvalid;
    }
}

template <typename T>
SYMCOMM_DEVICE WindowSlice<T> slice(const WindowHandleRaw* w, uint64_t offset) {
    return WindowHandle<T>(*w).at(offset);
}

}  // namespace

// ---- Errors ------------------------------------------------------------------------------------

SYMCOMM_RS_FFI void symcomm_rs_record_user_error(const DevComm* comm, uint32_t status, uint32_t peer, uint32_t code,
                                                 uint32_t value) {
    if (status == SYMCOMM_STATUS_OK || status > SYMCOMM_STATUS_INVALID_ARGUMENT) return;
    record_user_error(Thread{}, *comm, Status(status), peer, code, value);
}

SYMCOMM_RS_FFI uint32_t symcomm_rs_recorded_error(const DevComm* comm) { return uint32_t(recorded_error(*comm)); }

SYMCOMM_RS_FFI uint32_t symcomm_rs_abort_requested(const DevComm* comm) { return abort_requested(*comm) ? 1u : 0u; }

// ---- Signals and semaphores --------------------------------------------------------------------

SYMCOMM_RS_FFI uint32_t symcomm_rs_signal_set(const DevComm* comm, uint32_t scope, uint32_t peer, uint32_t word,
                                              uint64_t value) {
    return with_scope(
        scope, [&] { return signal_set<Scope::Gpu>(Thread{}, *comm, peer, word, value); },
        [&] { return signal_set<Scope::Sys>(Thread{}, *comm, peer, word, value); });
}

SYMCOMM_RS_FFI uint32_t symcomm_rs_signal_add(const DevComm* comm, uint32_t scope, uint32_t peer, uint32_t word,
                                              uint64_t delta, uint64_t* previous) {
    return with_scope(
        scope, [&] { return signal_add<Scope::Gpu>(Thread{}, *comm, peer, word, delta, previous); },
        [&] { return signal_add<Scope::Sys>(Thread{}, *comm, peer, word, delta, previous); });
}

SYMCOMM_RS_FFI uint32_t symcomm_rs_signal_wait_until(const DevComm* comm, uint32_t group, uint32_t scope,
                                                     uint32_t peer, uint32_t word, uint64_t value) {
    return with_group(group, [&](auto g) {
        return Status(with_scope(
            scope, [&] { return signal_wait_until<Scope::Gpu>(g, *comm, peer, word, value); },
            [&] { return signal_wait_until<Scope::Sys>(g, *comm, peer, word, value); }));
    });
}

SYMCOMM_RS_FFI uint32_t symcomm_rs_semaphore_signal(const DevComm* comm, uint32_t scope, uint32_t peer,
                                                    uint32_t word) {
    return with_scope(
        scope, [&] { return semaphore_signal<Scope::Gpu>(Thread{}, *comm, peer, word); },
        [&] { return semaphore_signal<Scope::Sys>(Thread{}, *comm, peer, word); });
}

SYMCOMM_RS_FFI uint32_t symcomm_rs_semaphore_wait(const DevComm* comm, uint32_t group, uint32_t scope, uint32_t peer,
                                                  uint32_t word, uint64_t* expected) {
    return with_group(group, [&](auto g) {
        return Status(with_scope(
            scope, [&] { return semaphore_wait<Scope::Gpu>(g, *comm, peer, word, expected); },
            [&] { return semaphore_wait<Scope::Sys>(g, *comm, peer, word, expected); }));
    });
}

// ---- Barriers ----------------------------------------------------------------------------------

SYMCOMM_RS_FFI uint32_t symcomm_rs_fingerprint(uint32_t kind, uint32_t dtype, uint32_t op, uint64_t count,
                                               uint32_t root) {
    return fingerprint(kind, dtype, op, count, root);
}

SYMCOMM_RS_FFI uint32_t symcomm_rs_user_fingerprint(uint32_t tag, uint64_t a, uint64_t b) {
    return user_fingerprint(tag, a, b);
}

SYMCOMM_RS_FFI uint32_t symcomm_rs_barrier(const DevComm* comm, uint32_t group, uint32_t index, uint32_t fp) {
    return with_group(group, [&](auto g) { return barrier(g, *comm, index, fp); });
}

SYMCOMM_RS_FFI uint32_t symcomm_rs_grid_sync(const DevComm* comm, uint32_t scope, uint64_t* state) {
    return with_scope(
        scope, [&] { return grid_sync<Scope::Gpu>(Cta{}, *comm, state); },
        [&] { return grid_sync<Scope::Sys>(Cta{}, *comm, state); });
}

// ---- Put / get ---------------------------------------------------------------------------------

SYMCOMM_RS_FFI uint32_t symcomm_rs_put(uint32_t group, const void* src, const WindowHandleRaw* dst, uint64_t dst_offset,
                                       uint32_t peer, uint64_t count, uint32_t elem_size) {
    return with_size(elem_size, [&](auto zero) {
        using T = decltype(zero);
        return with_group(group, [&](auto g) {
            return put(g, static_cast<const T*>(src), slice<T>(dst, dst_offset), peer, count);
        });
    });
}

SYMCOMM_RS_FFI uint32_t symcomm_rs_get(uint32_t group, const WindowHandleRaw* src, uint64_t src_offset, uint32_t peer,
                                       void* dst, uint64_t count, uint32_t elem_size) {
    return with_size(elem_size, [&](auto zero) {
        using T = decltype(zero);
        return with_group(group, [&](auto g) {
            return get(g, slice<T>(src, src_offset), peer, static_cast<T*>(dst), count);
        });
    });
}

SYMCOMM_RS_FFI uint32_t symcomm_rs_put_with_signal(const DevComm* comm, uint32_t group, const void* src,
                                                   const WindowHandleRaw* dst, uint64_t dst_offset, uint32_t peer,
                                                   uint64_t count, uint32_t elem_size, uint32_t word, uint64_t value) {
    return with_size(elem_size, [&](auto zero) {
        using T = decltype(zero);
        return with_group(group, [&](auto g) {
            return put_with_signal(g, *comm, static_cast<const T*>(src), slice<T>(dst, dst_offset), peer, count, word,
                                   value);
        });
    });
}

// ---- Collectives -------------------------------------------------------------------------------

/// `cta_part<T>` for T of `elem_size` bytes (1, 2, 4, 8; else the empty range) at the scope
/// (`grid`, `index`) — a CollScope's fields.
SYMCOMM_RS_FFI void symcomm_rs_cta_part(uint32_t grid, uint32_t index, uint64_t count, uint32_t elem_size, uint64_t* lo,
                                        uint64_t* hi) {
    *lo = 0;
    *hi = 0;
    (void)with_size(elem_size, [&](auto zero) {
        const Range r = cta_part<decltype(zero)>(CollScope{grid, index}, count);
        *lo = r.lo;
        *hi = r.hi;
        return 0u;
    });
}

/// `two_shot_part<T>` for T of `elem_size` bytes (as symcomm_rs_cta_part).
SYMCOMM_RS_FFI void symcomm_rs_two_shot_part(uint32_t grid, uint32_t index, uint32_t nranks, uint64_t count,
                                             uint32_t q, uint32_t elem_size, uint64_t* lo, uint64_t* hi) {
    *lo = 0;
    *hi = 0;
    (void)with_size(elem_size, [&](auto zero) {
        const Range r = two_shot_part<decltype(zero)>(CollScope{grid, index}, nranks, count, q);
        *lo = r.lo;
        *hi = r.hi;
        return 0u;
    });
}
