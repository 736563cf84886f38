//! The CUDA backend (driver API through cudarc, loaded dynamically).
