//! Test kernels: one per primitive family of symcomm-kernel, each run on every rank by the
//! example's tests (`tests/primitives.rs`), writing what it observed into an output window
//! (`out`, u64 words) that the host checks exactly.
//!
//! Group codes (the `group` arguments): 0 [`Thread`] (thread 0 alone), 1 [`Warp`] (warp 0),
//! 2 [`Cta`] (every thread). Statuses are written as their `SYMCOMM_STATUS_*` codes; 100 marks
//! an argument the test harness got wrong (a range that does not fit the kernel's own windows).

use symcomm_kernel::memory::{
    atomic_add_acq_rel, atomic_add_release, atomic_cas_acq_rel, backoff, globaltimer_ns,
    ld_acquire, ld_relaxed, st_relaxed, st_release,
};
use symcomm_kernel::prelude::*;

/// The code written for a harness error (a range outside the kernel's own windows).
pub(crate) const RK_BAD_ARGS: u64 = 100;

/// Stores `v` into element `i` of this rank's `out` copy when it fits (the host sizes `out`).
#[inline(always)]
fn store(out: &WindowHandle<u64>, i: u64, v: u64) {
    if out.fits(i, 1, 1) {
        // SAFETY: in bounds (checked); each index is written by one thread of one launch.
        unsafe { *out.local_ptr(i) = v };
    }
}

/// Whether the calling thread takes part in a call of group `group` (see the module docs).
#[inline(always)]
fn member(group: u32) -> bool {
    match group {
        0 => linear_thread_index() == 0,
        1 => linear_thread_index() < 32,
        _ => true,
    }
}

#[inline(always)]
fn scope_of(code: u32) -> Scope {
    if code == 0 { Scope::Gpu } else { Scope::Sys }
}

/// The value rank `rank` writes into element `i` of its ring successor at `epoch`.
#[inline(always)]
pub(crate) fn ring_value(rank: u32, epoch: u64, i: u32) -> u32 {
    rank.wrapping_mul(1_000_000)
        .wrapping_add((epoch as u32).wrapping_mul(1000))
        .wrapping_add(i)
}

symcomm_kernel::kernel! {
    /// Signals around the ring: every thread stores `ring_value(rank, epoch, i)` into elements
    /// `launch*n + i` (i < n) of the next rank's `data`, thread 0 `signal_set`s the next rank's
    /// word `word` to `epoch`, then the group `group` waits until the previous rank's word reaches
    /// `epoch` and every thread reads its own copy's elements. `out[launch*(n+2) ..]`: the set's
    /// status, the wait's status, the n values read. One CTA; a block of at least 32 threads.
    pub fn rk_signal_ring(
        comm: DevComm,
        data: WindowHandle<u32>,
        out: WindowHandle<u64>,
        group: u32,
        word: u32,
        epoch: u64,
        launch: u32,
        n: u32,
    ) {
        let (me, nr) = (comm.rank, comm.nranks);
        let next = (me + 1) % nr;
        let prev = (me + nr - 1) % nr;
        let t = linear_thread_index();
        let base = u64::from(launch) * u64::from(n);
        let ob = u64::from(launch) * (u64::from(n) + 2);
        if !data.holds() || !data.fits(base, u64::from(n), 1) {
            if t == 0 {
                store(&out, ob, RK_BAD_ARGS);
            }
            return;
        }
        let mut i = t;
        while i < n {
            // SAFETY: base + i < base + n fits in every copy (checked); one thread per element.
            unsafe { *data.peer_ptr(next, base + u64::from(i)) = ring_value(me, epoch, i) };
            i += Cta.size();
        }
        sync_threads();
        let set = if t == 0 {
            signal_set(Thread, &comm, Scope::Sys, next, word, epoch)
        } else {
            Status::Ok
        };
        let waited = if member(group) {
            match group {
                0 => signal_wait_until(Thread, &comm, Scope::Sys, prev, word, epoch),
                1 => signal_wait_until(Warp, &comm, Scope::Sys, prev, word, epoch),
                _ => signal_wait_until(Cta, &comm, Scope::Sys, prev, word, epoch),
            }
        } else {
            Status::Ok
        };
        sync_threads();
        if t == 0 {
            store(&out, ob, u64::from(set.code()));
            store(&out, ob + 1, u64::from(waited.code()));
        }
        let mut i = t;
        while i < n {
            // SAFETY: in bounds (checked above); the previous rank's stores were acquired by the
            // wait and handed to the CTA by the sync.
            let v = unsafe { *data.local_ptr(base + u64::from(i)) };
            store(&out, ob + 2 + u64::from(i), u64::from(v));
            i += Cta.size();
        }
    }
}

symcomm_kernel::kernel! {
    /// `signal_add` from every rank into every peer: thread t < nranks*adds adds `rank + 1` to the
    /// word `word` that peer `t % nranks` reserves for this rank, then thread p < nranks waits
    /// until peer p's word here reaches `(launch + 1) * adds * (p + 1)`.
    /// `out[launch*(2*nranks*adds + nranks) ..]`: each add's previous value, each add's status,
    /// each wait's status. Adds and waits at scope `scope` (0 Gpu, 1 Sys). One CTA.
    pub fn rk_signal_add(
        comm: DevComm,
        out: WindowHandle<u64>,
        word: u32,
        adds: u32,
        scope: u32,
        launch: u32,
    ) {
        let (me, nr) = (comm.rank, comm.nranks);
        let sc = scope_of(scope);
        let t = linear_thread_index();
        let total = nr * adds;
        let ob = u64::from(launch) * (2 * u64::from(total) + u64::from(nr));
        if t < total {
            let (s, previous) = signal_add(Thread, &comm, sc, t % nr, word, u64::from(me) + 1);
            store(&out, ob + u64::from(t), previous);
            store(&out, ob + u64::from(total + t), u64::from(s.code()));
        }
        if t < nr {
            let want = (u64::from(launch) + 1) * u64::from(adds) * (u64::from(t) + 1);
            let s = signal_wait_until(Thread, &comm, sc, t, word, want);
            store(&out, ob + 2 * u64::from(total) + u64::from(t), u64::from(s.code()));
        }
    }
}

symcomm_kernel::kernel! {
    /// Semaphores around the ring, `rounds` per launch: in round k (global index
    /// `g = launch*rounds + k`) thread 0 stores `rank << 32 | g` into element g of the next rank's
    /// `data` and `semaphore_signal`s it on `word`; the group `group` `semaphore_wait`s for the
    /// previous rank with the expected count in element 0 of this rank's `expected`; thread 0
    /// then reads element g of its own `data`. `out[3g ..]`: signal status, wait status, value.
    pub fn rk_semaphore(
        comm: DevComm,
        data: WindowHandle<u64>,
        expected: WindowHandle<u64>,
        out: WindowHandle<u64>,
        group: u32,
        word: u32,
        rounds: u32,
        launch: u32,
    ) {
        let (me, nr) = (comm.rank, comm.nranks);
        let next = (me + 1) % nr;
        let prev = (me + nr - 1) % nr;
        let t = linear_thread_index();
        let last = (u64::from(launch) + 1) * u64::from(rounds);
        if !data.holds() || !data.fits(0, last, 1) || !expected.holds() || !expected.fits(0, 1, 1) {
            if t == 0 {
                store(&out, 0, RK_BAD_ARGS);
            }
            return;
        }
        for k in 0..rounds {
            let g = u64::from(launch) * u64::from(rounds) + u64::from(k);
            let signalled = if t == 0 {
                // SAFETY: g < last fits (checked); only this thread writes element g of next.
                unsafe { *data.peer_ptr(next, g) = (u64::from(me) << 32) | g };
                semaphore_signal(Thread, &comm, Scope::Sys, next, word)
            } else {
                Status::Ok
            };
            let waited = if member(group) {
                let e = expected.local_ptr(0);
                // SAFETY: element 0 of this rank's `expected` (checked), touched only by these
                // calls of one group at a time.
                unsafe {
                    match group {
                        0 => semaphore_wait(Thread, &comm, Scope::Sys, prev, word, e),
                        1 => semaphore_wait(Warp, &comm, Scope::Sys, prev, word, e),
                        _ => semaphore_wait(Cta, &comm, Scope::Sys, prev, word, e),
                    }
                }
            } else {
                Status::Ok
            };
            sync_threads();
            if t == 0 {
                // SAFETY: in bounds; the previous rank's store was acquired by the wait.
                let v = unsafe { *data.local_ptr(g) };
                store(&out, 3 * g, u64::from(signalled.code()));
                store(&out, 3 * g + 1, u64::from(waited.code()));
                store(&out, 3 * g + 2, v);
            }
            sync_threads();
        }
    }
}

/// Spins with acquire loads until `*p >= want` or the communicator's deadline passes; returns
/// 0 (reached) or 1 (timed out).
///
/// # Safety
/// `p` is a valid, aligned word of a window, accessed only atomically meanwhile.
#[inline(always)]
unsafe fn spin_until_u32(comm: &DevComm, sc: Scope, p: *const u32, want: u32) -> u64 {
    let start = globaltimer_ns();
    // SAFETY: the caller's contract.
    while unsafe { ld_acquire(sc, p) } < want {
        if globaltimer_ns().wrapping_sub(start) > comm.timeout_ns {
            return 1;
        }
        backoff(64);
    }
    0
}

/// As [`spin_until_u32`], for a u64 word.
///
/// # Safety
/// As [`spin_until_u32`].
#[inline(always)]
unsafe fn spin_until_u64(comm: &DevComm, sc: Scope, p: *const u64, want: u64) -> u64 {
    let start = globaltimer_ns();
    // SAFETY: the caller's contract.
    while unsafe { ld_acquire(sc, p) } < want {
        if globaltimer_ns().wrapping_sub(start) > comm.timeout_ns {
            return 1;
        }
        backoff(64);
    }
    0
}

/// Words per launch of `rk_memory` in `ctr` and in `out`, and in `flag`.
pub(crate) const RK_MEMORY_WORDS: u64 = 16;
/// u32 words per launch of `rk_memory` in `flag`.
pub(crate) const RK_MEMORY_FLAGS: u64 = 4;

symcomm_kernel::kernel! {
    /// The ordered memory operations on window words at scope `scope` (0 Gpu, 1 Sys), launch
    /// `launch` using words `16*launch ..` of `ctr` / `out` and `4*launch ..` of `flag`:
    /// - thread t < nranks*adds `atomic_add_release`s `rank + 1` to ctr[b] and
    ///   `atomic_add_acq_rel`s 1 to ctr[b+1] of peer `t % nranks`;
    /// - thread 0 `atomic_cas_acq_rel`s rank 0's flag[f] from 0 to `rank + 1` (out[b]: old);
    /// - thread 0 passes a message to the next rank twice: `st_relaxed` of `rank << 32 | epoch`
    ///   into its ctr[b+2] then `st_release` of `epoch` into its u32 flag[f+1], and
    ///   `st_relaxed` of `!payload` into ctr[b+3] then `st_release` of `epoch` into u64 ctr[b+4];
    ///   it waits for the previous rank's with `ld_acquire` and reads the payload with
    ///   `ld_relaxed` (out[b+1..b+5]: wait 0 / timeout 1, payload, wait, payload);
    /// - barrier (index `slot`, `user_fingerprint(tag, epoch, 0)`; out[b+5]: status), then thread 0
    ///   reads its ctr[b] (`ld_acquire`), ctr[b+1] (`ld_relaxed`) and rank 0's flag[f]
    ///   (`ld_relaxed`) into out[b+6..b+9]; a second barrier (out[b+9]).
    pub fn rk_memory(
        comm: DevComm,
        ctr: WindowHandle<u64>,
        flag: WindowHandle<u32>,
        out: WindowHandle<u64>,
        scope: u32,
        adds: u32,
        slot: u32,
        tag: u32,
        epoch: u64,
        launch: u32,
    ) {
        let (me, nr) = (comm.rank, comm.nranks);
        let next = (me + 1) % nr;
        let sc = scope_of(scope);
        let t = linear_thread_index();
        let b = u64::from(launch) * RK_MEMORY_WORDS;
        let f = u64::from(launch) * RK_MEMORY_FLAGS;
        if !ctr.fits(b, RK_MEMORY_WORDS, 1) || !flag.fits(f, RK_MEMORY_FLAGS, 1) {
            if t == 0 {
                store(&out, b, RK_BAD_ARGS);
            }
            return;
        }
        if t < nr * adds {
            let peer = t % nr;
            // SAFETY: words b and b+1 of every copy fit (checked); accessed only atomically
            // while kernels run.
            unsafe {
                let _ = atomic_add_release(sc, ctr.peer_ptr(peer, b), u64::from(me) + 1);
                let _ = atomic_add_acq_rel(sc, ctr.peer_ptr(peer, b + 1), 1);
            }
        }
        if t == 0 {
            // SAFETY: word f of rank 0's copy fits; accessed only atomically.
            let old = unsafe { atomic_cas_acq_rel(sc, flag.peer_ptr(0, f), 0, me + 1) };
            store(&out, b, u64::from(old));
            let payload = (u64::from(me) << 32) | epoch;
            // SAFETY: the words fit (checked); the flags and payloads are accessed atomically.
            unsafe {
                st_relaxed(sc, ctr.peer_ptr(next, b + 2), payload);
                st_release(sc, flag.peer_ptr(next, f + 1), epoch as u32);
                st_relaxed(sc, ctr.peer_ptr(next, b + 3), !payload);
                st_release(sc, ctr.peer_ptr(next, b + 4), epoch);
            }
            // SAFETY: as above, this rank's own words.
            unsafe {
                let w = spin_until_u32(&comm, sc, flag.local_ptr(f + 1), epoch as u32);
                store(&out, b + 1, w);
                store(&out, b + 2, ld_relaxed(sc, ctr.local_ptr(b + 2)));
                let w = spin_until_u64(&comm, sc, ctr.local_ptr(b + 4), epoch);
                store(&out, b + 3, w);
                store(&out, b + 4, ld_relaxed(sc, ctr.local_ptr(b + 3)));
            }
        }
        sync_threads();
        let fp = user_fingerprint(tag, epoch, 0);
        let s = barrier(Cta, &comm, slot, fp);
        if t == 0 {
            store(&out, b + 5, u64::from(s.code()));
            // SAFETY: as above; every add and the CAS were made before the barrier.
            unsafe {
                store(&out, b + 6, ld_acquire(sc, ctr.local_ptr(b)));
                store(&out, b + 7, ld_relaxed(sc, ctr.local_ptr(b + 1)));
                store(&out, b + 8, u64::from(ld_relaxed(sc, flag.peer_ptr(0, f))));
            }
        }
        sync_threads();
        let s2 = barrier(Cta, &comm, slot, fp);
        if t == 0 {
            store(&out, b + 9, u64::from(s2.code()));
        }
    }
}

/// What rank `from` writes into rank `to`'s `data` in round `g` of `rk_barrier`.
#[inline(always)]
pub(crate) fn barrier_value(from: u32, to: u32, g: u64) -> u64 {
    (g << 40) | (u64::from(from) << 20) | u64::from(to)
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn barrier_rounds<G: Group>(
    g: G,
    comm: &DevComm,
    data: WindowHandle<u64>,
    out: WindowHandle<u64>,
    slot: u32,
    tag: u32,
    a: u64,
    rounds: u32,
    launch: u32,
) {
    let (me, nr) = (comm.rank, comm.nranks);
    let n = u64::from(nr);
    let (gr, gs) = (g.thread_rank(), g.size());
    for k in 0..rounds {
        let round = u64::from(launch) * u64::from(rounds) + u64::from(k);
        let ob = round * (n + 1);
        if !data.fits(round * n, n, 1) {
            if gr == 0 {
                store(&out, ob + n, RK_BAD_ARGS);
            }
            return;
        }
        let mut p = gr;
        while p < nr {
            // SAFETY: element round*n + me fits (checked); only this thread writes it.
            unsafe { *data.peer_ptr(p, round * n + u64::from(me)) = barrier_value(me, p, round) };
            p += gs;
        }
        let s = barrier(g, comm, slot, user_fingerprint(tag, a, round));
        if gr == 0 {
            store(&out, ob + n, u64::from(s.code()));
        }
        if s != Status::Ok {
            return;
        }
        let mut p = gr;
        while p < nr {
            // SAFETY: in bounds (checked); published by the barrier.
            let v = unsafe { *data.local_ptr(round * n + u64::from(p)) };
            store(&out, ob + u64::from(p), v);
            p += gs;
        }
    }
}

symcomm_kernel::kernel! {
    /// `rounds` barriers of group `group` on index `slot` with `user_fingerprint(tag, a, g)`
    /// (g = launch*rounds + k, the global round): before each, the group stores
    /// `barrier_value(rank, p, g)` into element `g*nranks + rank` of every peer p's `data`;
    /// after it, the group reads elements `g*nranks + p` of its own copy. `out[g*(nranks+1) ..]`:
    /// the nranks values read, then the barrier's status. Stops at the first failed barrier.
    pub fn rk_barrier(
        comm: DevComm,
        data: WindowHandle<u64>,
        out: WindowHandle<u64>,
        group: u32,
        slot: u32,
        tag: u32,
        a: u64,
        rounds: u32,
        launch: u32,
    ) {
        if !member(group) {
            return;
        }
        match group {
            0 => barrier_rounds(Thread, &comm, data, out, slot, tag, a, rounds, launch),
            1 => barrier_rounds(Warp, &comm, data, out, slot, tag, a, rounds, launch),
            _ => barrier_rounds(Cta, &comm, data, out, slot, tag, a, rounds, launch),
        }
    }
}

/// The arguments of one `rk_p2p` call.
#[derive(Clone, Copy)]
struct P2p {
    src: WindowHandleRaw,
    dst: WindowHandleRaw,
    out: WindowHandle<u64>,
    mode: u32,
    count: u64,
    src_off: u64,
    dst_off: u64,
    word: u32,
    epoch: u64,
    slot: u32,
}

#[inline(always)]
fn p2p_body<G: Group, T: Copy>(g: G, comm: &DevComm, a: P2p) {
    let (me, nr) = (comm.rank, comm.nranks);
    let next = (me + 1) % nr;
    let prev = (me + nr - 1) % nr;
    let src = WindowHandle::<T>::new(a.src);
    let dst = WindowHandle::<T>::new(a.dst);
    let lead = g.thread_rank() == 0;
    let fp = user_fingerprint(0x9e7, a.count, u64::from(a.mode));
    match a.mode {
        0 | 2 => {
            // The source is this rank's own copy of `src`: it must fit (the destination range
            // is the one the library checks).
            if !src.holds() || !src.fits(a.src_off, a.count, 1) {
                if lead {
                    store(&a.out, 0, RK_BAD_ARGS);
                }
                return;
            }
            let from = src.local_ptr(a.src_off).cast_const();
            if a.mode == 0 {
                // SAFETY: `from` is valid for `count` elements (checked above).
                let s = unsafe { put(g, from, dst.at(a.dst_off), next, a.count) };
                let b = barrier(g, comm, a.slot, fp);
                if lead {
                    store(&a.out, 0, u64::from(s.code()));
                    store(&a.out, 1, u64::from(b.code()));
                }
            } else {
                // SAFETY: as above.
                let s = unsafe {
                    put_with_signal(
                        g,
                        comm,
                        from,
                        dst.at(a.dst_off),
                        next,
                        a.count,
                        a.word,
                        a.epoch,
                    )
                };
                let w = signal_wait_until(g, comm, Scope::Sys, prev, a.word, a.epoch);
                // Keeps the source alive (and unchanged) until the peer read it.
                let b = barrier(g, comm, a.slot, fp);
                if lead {
                    store(&a.out, 0, u64::from(s.code()));
                    store(&a.out, 1, u64::from(w.code()));
                    store(&a.out, 2, u64::from(b.code()));
                }
            }
        }
        _ => {
            if !dst.holds() || !dst.fits(a.dst_off, a.count, 1) {
                if lead {
                    store(&a.out, 0, RK_BAD_ARGS);
                }
                return;
            }
            let b0 = barrier(g, comm, a.slot, fp);
            let to = dst.local_ptr(a.dst_off);
            // SAFETY: `to` is valid for `count` elements of this rank's own copy (checked).
            let s = unsafe { get(g, src.at(a.src_off), prev, to, a.count) };
            let b1 = barrier(g, comm, a.slot, fp);
            if lead {
                store(&a.out, 0, u64::from(s.code()));
                store(&a.out, 1, u64::from(b0.code()));
                store(&a.out, 2, u64::from(b1.code()));
            }
        }
    }
}

symcomm_kernel::kernel! {
    /// Put / get / put with signal with the next (put) or previous (get) rank in the ring, on
    /// elements of `elem` bytes (4: u32, 8: u64) by group `group` (1 Warp, 2 Cta), `mode` 0 put
    /// (this rank's `src[src_off, +count)` into the next rank's `dst[dst_off, ..)`, then a
    /// barrier), 1 get (a barrier, the previous rank's `src[src_off, ..)` into this rank's
    /// `dst[dst_off, ..)`, a barrier), 2 put_with_signal on `word` with `epoch`, then a wait for
    /// the previous rank's signal and a barrier. `out[0..3]`: the statuses in that order.
    pub fn rk_p2p(
        comm: DevComm,
        src: WindowHandleRaw,
        dst: WindowHandleRaw,
        out: WindowHandle<u64>,
        elem: u32,
        group: u32,
        mode: u32,
        count: u64,
        src_off: u64,
        dst_off: u64,
        word: u32,
        epoch: u64,
        slot: u32,
    ) {
        let a = P2p { src, dst, out, mode, count, src_off, dst_off, word, epoch, slot };
        if group == 1 && !member(1) {
            return;
        }
        match (elem, group) {
            (4, 1) => p2p_body::<Warp, u32>(Warp, &comm, a),
            (4, _) => p2p_body::<Cta, u32>(Cta, &comm, a),
            (8, 1) => p2p_body::<Warp, u64>(Warp, &comm, a),
            (8, _) => p2p_body::<Cta, u64>(Cta, &comm, a),
            _ => {
                if linear_thread_index() == 0 {
                    store(&out, 0, RK_BAD_ARGS);
                }
            }
        }
    }
}

#[inline(always)]
fn red_op(op: u32) -> RedOp {
    match op {
        0 => RedOp::Sum,
        1 => RedOp::Prod,
        2 => RedOp::Min,
        3 => RedOp::Max,
        _ => RedOp::Avg,
    }
}

symcomm_kernel::kernel! {
    /// Across hosts (one CTA): `out[p]` = whether rank p is on this host (`on_this_host`, p < n);
    /// then one round of a ring of `put_with_signal` (through the proxy when the next rank is on
    /// another host): the CTA stages `ring_value(rank, epoch, i)` (i < count) into this rank's
    /// `data` at [count, 2 count), puts it into the next rank's [0, count) with signal `word` set
    /// to `epoch`, and waits for the previous rank's signal; thread 0 then counts the elements of
    /// [0, count) that differ from `ring_value(prev, epoch, i)`. out[n], out[n + 1], out[n + 2]:
    /// the put's status, the wait's status, the wrong count.
    pub fn rk_hosts_ring(
        comm: DevComm,
        data: WindowHandle<u32>,
        out: WindowHandle<u64>,
        count: u32,
        word: u32,
        epoch: u64,
    ) {
        let (rank, n) = (comm.rank, comm.nranks);
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        let t = linear_thread_index();
        let c = u64::from(count);
        if !data.fits(0, c, 2) || !out.fits(0, u64::from(n) + 3, 1) {
            if t == 0 {
                store(&out, 0, RK_BAD_ARGS);
            }
            return;
        }
        if t == 0 {
            for p in 0..n {
                store(&out, u64::from(p), u64::from(data.on_this_host(p)));
            }
        }
        let mut i = t;
        while i < count {
            // SAFETY: element count + i < 2 count of this rank's copy (checked above); each
            // element is written by one thread.
            unsafe { *data.local_ptr(c + u64::from(i)) = ring_value(rank, epoch, i) };
            i += Cta.size();
        }
        // SAFETY: the staged elements lie in this rank's copy (global memory), which the group
        // synchronizes before the put reads them.
        let put = unsafe {
            put_with_signal(Cta, &comm, data.local_ptr(c), data.at(0), next, c, word, epoch)
        };
        let wait = if put.is_ok() {
            signal_wait_until(Cta, &comm, Scope::Sys, prev, word, epoch)
        } else {
            put
        };
        if t == 0 {
            let mut wrong = 0u64;
            if wait.is_ok() {
                for i in 0..count {
                    // SAFETY: element i < count of this rank's copy, written by the previous
                    // rank's put, acquired by the wait above.
                    let v = unsafe { *data.local_ptr(u64::from(i)) };
                    wrong += u64::from(v != ring_value(prev, epoch, i));
                }
            }
            store(&out, u64::from(n), u64::from(put.code()));
            store(&out, u64::from(n) + 1, u64::from(wait.code()));
            store(&out, u64::from(n) + 2, wrong);
        }
    }
}

/// The arguments of one `rk_collective` call.
#[derive(Clone, Copy)]
struct Coll {
    src: WindowHandleRaw,
    dst: WindowHandleRaw,
    kind: u32,
    op: u32,
    root: u32,
    count: u64,
    src_off: u64,
    dst_off: u64,
    scope: CollScope,
}

// Not inlined: in a debug build, the eight instances inlined into `rk_collective` would make a
// frame larger than the emulator's default fiber stack (64 KiB, SYMCOMM_EMU_STACK_BYTES).
#[inline(never)]
fn collective<T: Element>(comm: &DevComm, c: Coll) -> u64 {
    let src = WindowHandle::<T>::new(c.src).at(c.src_off);
    let dst = WindowHandle::<T>::new(c.dst).at(c.dst_off);
    let (sc, n, op) = (c.scope, c.count, red_op(c.op));
    let s = match c.kind {
        0 => all_reduce_one_shot(Cta, comm, sc, src, dst, n, op),
        1 => all_reduce_two_shot(Cta, comm, sc, src, dst, n, op),
        2 => all_gather(Cta, comm, sc, src, dst, n),
        3 => reduce_scatter(Cta, comm, sc, src, dst, n, op),
        4 => broadcast(Cta, comm, sc, src, dst, n, c.root),
        5 => reduce(Cta, comm, sc, src, dst, n, op, c.root),
        6 => scatter(Cta, comm, sc, src, dst, n, c.root),
        7 => all_to_all(Cta, comm, sc, src, dst, n),
        8 => all_reduce_ll(Cta, comm, sc, src, dst, n, op),
        9 => all_gather_ll(Cta, comm, sc, src, dst, n),
        10 => reduce_scatter_ll(Cta, comm, sc, src, dst, n, op),
        11 => broadcast_ll(Cta, comm, sc, src, dst, n, c.root),
        _ => return RK_BAD_ARGS,
    };
    u64::from(s.code())
}

symcomm_kernel::kernel! {
    /// One collective of the device library: `kind` a `SYMCOMM_COLL_*` code, `dtype` a
    /// `SYMCOMM_DTYPE_*` code (every element type of the library), `op` a `SYMCOMM_REDOP_*` code,
    /// `src[src_off ..]` to `dst[dst_off ..]`, at grid scope (`grid` 1, CTA b on barrier index
    /// `first + b`) or CTA scope (`grid` 0, index `first`; launch one CTA). `status[b]`: CTA b's
    /// status.
    pub fn rk_collective(
        comm: DevComm,
        src: WindowHandleRaw,
        dst: WindowHandleRaw,
        status: WindowHandle<u64>,
        kind: u32,
        dtype: u32,
        op: u32,
        root: u32,
        count: u64,
        src_off: u64,
        dst_off: u64,
        grid: u32,
        first: u32,
    ) {
        let scope = if grid != 0 { grid_scope(first) } else { cta_scope(first) };
        let c = Coll { src, dst, kind, op, root, count, src_off, dst_off, scope };
        let s = match dtype {
            0 => collective::<f32>(&comm, c),
            1 => collective::<f64>(&comm, c),
            2 => collective::<F16>(&comm, c),
            3 => collective::<Bf16>(&comm, c),
            8 => collective::<i32>(&comm, c),
            9 => collective::<u32>(&comm, c),
            10 => collective::<i64>(&comm, c),
            11 => collective::<u64>(&comm, c),
            _ => RK_BAD_ARGS,
        };
        if linear_thread_index() == 0 {
            store(&status, u64::from(block_idx().x), s);
        }
    }
}

/// What thread t of CTA b writes in round g of `rk_grid`.
#[inline(always)]
pub(crate) fn grid_value(g: u64, b: u32, t: u32) -> u64 {
    (g << 32) | (u64::from(b) << 16) | u64::from(t)
}

symcomm_kernel::kernel! {
    /// `cta_part` and `grid_sync` across the CTAs of one launch (1-D grid of G CTAs of B threads).
    /// Thread 0 of CTA b writes `cta_part` of `count` elements at `grid_scope(first)` for u32,
    /// u64 and Bf16 and at `cta_scope(first)` for f32 into out[8b .. 8b+8] (lo, hi pairs). Then
    /// `rounds` rounds (global round g = launch*rounds + k): every thread stores
    /// `grid_value(g, b, t)` into element `(g%2)*G*B + b*B + t` of this rank's `data`,
    /// `grid_sync`s (state: element 0 of this rank's `state`), and reads CTA (b+1)%G's element;
    /// out[8G + b*B + t]: how many values it read wrong over the rounds (accumulated over
    /// launches), out[8G + G*B + g*G + b]: CTA b's grid_sync status in round g.
    pub fn rk_grid(
        comm: DevComm,
        state: WindowHandle<u64>,
        data: WindowHandle<u64>,
        out: WindowHandle<u64>,
        count: u64,
        rounds: u32,
        first: u32,
        launch: u32,
    ) {
        let (b, gd) = (block_idx().x, grid_dim().x);
        let (t, bd) = (linear_thread_index(), Cta.size());
        let (big_g, big_b) = (u64::from(gd), u64::from(bd));
        if t == 0 {
            let o = 8 * u64::from(b);
            let parts = [
                cta_part::<u32>(grid_scope(first), count),
                cta_part::<u64>(grid_scope(first), count),
                cta_part::<Bf16>(grid_scope(first), count),
                cta_part::<f32>(cta_scope(first), count),
            ];
            for (j, p) in parts.iter().enumerate() {
                store(&out, o + 2 * j as u64, p.lo);
                store(&out, o + 2 * j as u64 + 1, p.hi);
            }
        }
        if !state.fits(0, 1, 1) || !data.fits(0, 2 * big_g * big_b, 1) {
            if t == 0 {
                store(&out, 8 * big_g + big_g * big_b, RK_BAD_ARGS);
            }
            return;
        }
        let wrong_at = 8 * big_g + u64::from(b) * big_b + u64::from(t);
        let mut wrong = if out.fits(wrong_at, 1, 1) {
            // SAFETY: in bounds; only this thread touches this word.
            unsafe { *out.local_ptr(wrong_at) }
        } else {
            0
        };
        let other = (b + 1) % gd;
        for k in 0..rounds {
            let g = u64::from(launch) * u64::from(rounds) + u64::from(k);
            let half = (g % 2) * big_g * big_b;
            // SAFETY: half + b*B + t < 2*G*B fits (checked); only this thread writes it.
            unsafe { *data.local_ptr(half + u64::from(b) * big_b + u64::from(t)) = grid_value(g, b, t) };
            // SAFETY: element 0 of this rank's `state` (checked), used by this grid only; every
            // thread of every CTA calls; the host launches co-resident.
            let s = unsafe { grid_sync(Cta, &comm, Scope::Gpu, state.local_ptr(0)) };
            if t == 0 {
                store(&out, 8 * big_g + big_g * big_b + g * big_g + u64::from(b), u64::from(s.code()));
            }
            if s != Status::Ok {
                return;
            }
            // SAFETY: in bounds; written before the grid sync by CTA `other`.
            let v = unsafe { *data.local_ptr(half + u64::from(other) * big_b + u64::from(t)) };
            if v != grid_value(g, other, t) {
                wrong += 1;
            }
        }
        store(&out, wrong_at, wrong);
    }
}
