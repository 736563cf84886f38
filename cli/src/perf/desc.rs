//! What the collectives do: the description table (buffer layouts, in-place conventions, what
//! each output element holds).

use symcomm::Collective;

/// Blocks of `count` elements in a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blocks {
    One,
    PerRank,
}

/// Where the in-place form puts the send and receive buffers inside the one buffer (NCCL's
/// conventions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InPlace {
    /// The same memory.
    Same,
    /// send = recv + rank·count (all-gather).
    SendAtOwnBlock,
    /// recv = send + rank·count (reduce-scatter, scatter).
    RecvAtOwnBlock,
}

/// What rank r's output holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    /// Element j: the reduction of every rank's element j (all-reduce).
    Reduced,
    /// As [`Output::Reduced`] on the root only (reduce).
    ReducedOnRoot,
    /// Element j: the root's element j (broadcast).
    RootsCopy,
    /// Block p: rank p's input (all-gather).
    Gathered,
    /// The reduction of every rank's block r (reduce-scatter).
    ReducedOwnBlock,
    /// The root's block r (scatter).
    RootsOwnBlock,
    /// Block p: rank p's block r (all-to-all).
    Transposed,
    /// The input of rank r − 1 (sendrecv: nccl-tests' ring, send to r + 1, receive from r − 1).
    FromPrevious,
}

/// One collective's layout and result.
#[derive(Debug, Clone, Copy)]
pub(super) struct Desc {
    pub(super) coll: Collective,
    send: Blocks,
    recv: Blocks,
    in_place: InPlace,
    output: Output,
}

pub(super) const DESCS: [Desc; 8] = [
    Desc {
        coll: Collective::AllReduce,
        send: Blocks::One,
        recv: Blocks::One,
        in_place: InPlace::Same,
        output: Output::Reduced,
    },
    Desc {
        coll: Collective::AllGather,
        send: Blocks::One,
        recv: Blocks::PerRank,
        in_place: InPlace::SendAtOwnBlock,
        output: Output::Gathered,
    },
    Desc {
        coll: Collective::ReduceScatter,
        send: Blocks::PerRank,
        recv: Blocks::One,
        in_place: InPlace::RecvAtOwnBlock,
        output: Output::ReducedOwnBlock,
    },
    Desc {
        coll: Collective::Broadcast,
        send: Blocks::One,
        recv: Blocks::One,
        in_place: InPlace::Same,
        output: Output::RootsCopy,
    },
    Desc {
        coll: Collective::Reduce,
        send: Blocks::One,
        recv: Blocks::One,
        in_place: InPlace::Same,
        output: Output::ReducedOnRoot,
    },
    Desc {
        coll: Collective::Scatter,
        send: Blocks::PerRank,
        recv: Blocks::One,
        in_place: InPlace::RecvAtOwnBlock,
        output: Output::RootsOwnBlock,
    },
    Desc {
        coll: Collective::AllToAll,
        send: Blocks::PerRank,
        recv: Blocks::PerRank,
        in_place: InPlace::Same,
        output: Output::Transposed,
    },
    Desc {
        coll: Collective::SendRecv,
        send: Blocks::One,
        recv: Blocks::One,
        in_place: InPlace::Same,
        output: Output::FromPrevious,
    },
];

/// Where the expected value of one output element comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// The reduction over every rank of input element `index`.
    Reduce { index: u64 },
    /// Rank `rank`'s input element `index`.
    Copy { rank: u32, index: u64 },
    /// What the buffer held before the call (reduce's output on other ranks than the root:
    /// NCCL leaves it untouched).
    Untouched,
}

impl Desc {
    pub(super) fn find(coll: Collective) -> Option<&'static Desc> {
        DESCS.iter().find(|d| d.coll == coll)
    }

    fn blocks(b: Blocks, n: u64) -> u64 {
        match b {
            Blocks::One => 1,
            Blocks::PerRank => n,
        }
    }

    /// The shape of one row: nccl-tests' `getCollByteCount` for a size of `bytes`. Per-rank
    /// blocks (all-gather, reduce-scatter, scatter, all-to-all) hold `bytes / dsize / nranks`
    /// elements rounded down to a multiple of `16 / dsize` (16 bytes per block).
    pub(super) fn shape(&self, bytes: u64, dsize: u64, nranks: u32) -> Shape {
        let n = u64::from(nranks);
        let (sb, rb) = (Self::blocks(self.send, n), Self::blocks(self.recv, n));
        let count = if sb.max(rb) > 1 {
            let align = (16 / dsize).max(1);
            bytes / dsize / n / align * align
        } else {
            bytes / dsize
        };
        Shape {
            count,
            send_elems: count * sb,
            recv_elems: count * rb,
            bytes: count * sb.max(rb) * dsize,
        }
    }

    /// (send, recv) element offsets inside the one in-place buffer of `rank`.
    pub(super) fn in_place_offsets(&self, rank: u32, count: u64) -> (u64, u64) {
        let own = u64::from(rank) * count;
        match self.in_place {
            InPlace::Same => (0, 0),
            InPlace::SendAtOwnBlock => (own, 0),
            InPlace::RecvAtOwnBlock => (0, own),
        }
    }

    /// What output element `j` of `rank` (of `nranks`) must hold (`count` per block).
    pub(super) fn source(&self, rank: u32, nranks: u32, root: u32, count: u64, j: u64) -> Source {
        let own = u64::from(rank) * count;
        let (block, at) = (j / count.max(1), j % count.max(1));
        match self.output {
            Output::Reduced => Source::Reduce { index: j },
            Output::ReducedOnRoot if rank == root => Source::Reduce { index: j },
            Output::ReducedOnRoot => Source::Untouched,
            Output::RootsCopy => Source::Copy {
                rank: root,
                index: j,
            },
            Output::Gathered => Source::Copy {
                rank: block as u32,
                index: at,
            },
            Output::ReducedOwnBlock => Source::Reduce { index: own + j },
            Output::RootsOwnBlock => Source::Copy {
                rank: root,
                index: own + j,
            },
            Output::Transposed => Source::Copy {
                rank: block as u32,
                index: own + at,
            },
            Output::FromPrevious => Source::Copy {
                rank: (rank + nranks - 1) % nranks,
                index: j,
            },
        }
    }
}

/// One row's element counts (nccl-tests' `setupArgs`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    /// The per-rank count passed to the call (the `count` column).
    pub(super) count: u64,
    pub(super) send_elems: u64,
    pub(super) recv_elems: u64,
    /// The `size` column: max(send, recv) bytes.
    pub(super) bytes: u64,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn desc(c: Collective) -> &'static Desc {
        Desc::find(c).unwrap()
    }

    /// nccl-tests' `(count / nranks) & ~(16 / eltSize - 1)` for the per-rank-block collectives.
    #[test]
    fn per_rank_counts_trimmed_to_16_bytes() {
        for c in [
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::Scatter,
            Collective::AllToAll,
        ] {
            // 4096 B of f32 over 3 ranks: 341 per rank, 340 after trimming.
            let s = desc(c).shape(4096, 4, 3);
            assert_eq!((s.count, s.bytes), (340, 340 * 3 * 4), "{}", c.name());
            // int8: multiples of 16 elements; 100 B over 2 ranks: 50 -> 48.
            assert_eq!(desc(c).shape(100, 1, 2).count, 48);
            // double: multiples of 2; 120 B over 5 ranks: 3 -> 2.
            assert_eq!(desc(c).shape(120, 8, 5).count, 2);
            // Below 16 bytes per rank: nothing.
            assert_eq!(desc(c).shape(64, 4, 5).count, 0);
        }
        for c in [
            Collective::AllReduce,
            Collective::Broadcast,
            Collective::Reduce,
        ] {
            let s = desc(c).shape(4100, 4, 3);
            assert_eq!((s.count, s.bytes), (1025, 4100));
        }
    }

    #[test]
    fn reduce_leaves_other_ranks_untouched() {
        let d = desc(Collective::Reduce);
        assert_eq!(d.source(1, 3, 0, 8, 5), Source::Untouched);
        assert_eq!(d.source(0, 3, 0, 8, 5), Source::Reduce { index: 5 });
    }
}
