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
    /// Not specified (reduce's output on other ranks than the root).
    Unchecked,
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

    /// The shape of one row: nccl-tests' `getCollByteCount` for a size of `bytes`.
    pub(super) fn shape(&self, bytes: u64, dsize: u64, nranks: u32) -> Shape {
        let n = u64::from(nranks);
        let (sb, rb) = (Self::blocks(self.send, n), Self::blocks(self.recv, n));
        let count = bytes / dsize / sb.max(rb);
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
            Output::ReducedOnRoot => Source::Unchecked,
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
