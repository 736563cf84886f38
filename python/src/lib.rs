//! `symcomm._symcomm`: the Python extension module under the `symcomm` package.
//!
//! The package's Python layer (`python/symcomm/__init__.py`) turns arrays and tensors into the
//! plain arguments taken here (addresses, byte counts, type names); this module holds the
//! communicator, its windows and streams, and maps the library's errors onto the exceptions of
//! `symcomm/errors.py` (`errors.rs`). Windows leave through DLPack (`dlpack.rs`). Every call that can block (joining,
//! collectives, barriers, waits) releases the GIL, so ranks may be Python threads.

// pyo3's macros expand to items without docs (the Python-facing docs are the doc comments,
// which pyo3 turns into docstrings).
#![allow(missing_docs)]

mod comm;
mod dlpack;
mod errors;

use pyo3::prelude::*;

#[pymodule]
fn _symcomm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<comm::UniqueId>()?;
    m.add_class::<comm::Communicator>()?;
    m.add_class::<comm::Window>()?;
    m.add_class::<comm::Stream>()?;
    m.add_function(wrap_pyfunction!(comm::dtypes, m)?)?;
    // The signal area's layout (abi.h), for kernels written in Python (`symcomm.triton`).
    use symcomm::abi;
    m.add("SIGNAL_WORDS", abi::SYMCOMM_SIGNAL_WORDS)?;
    m.add("USER_SIGNAL_END", abi::SYMCOMM_USER_SIGNAL_END)?;
    m.add("BARRIER_WORD_FIRST", abi::SYMCOMM_BARRIER_WORD_FIRST)?;
    m.add("USER_BARRIER_FIRST", symcomm::USER_BARRIER_FIRST)?;
    m.add("USER_BARRIER_END", symcomm::USER_BARRIER_END)?;
    Ok(())
}
